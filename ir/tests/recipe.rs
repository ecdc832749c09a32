//! Weight recipes: shapes of nested recipes, their errors, their leaves, and their literal form.

use glmc_ir::lit::{AttrValue, Lit};
use glmc_ir::{Recipe, RecipeError};

fn hf(name: &str, shape: &[u64]) -> Recipe {
    Recipe::tensor(name, shape.to_vec())
}

fn stack(pattern: &str, count: u64, shape: &[u64]) -> Recipe {
    Recipe::Stack {
        pattern: pattern.into(),
        count,
        shape: shape.to_vec(),
    }
}

#[test]
fn leaf_shapes() {
    assert_eq!(hf("w", &[6144, 2048]).shape().unwrap(), vec![6144, 2048]);
    assert_eq!(hf("scalar", &[]).shape().unwrap(), Vec::<u64>::new());
    assert_eq!(
        stack("mlp.experts.{e}.up_proj.weight", 256, &[2048, 6144])
            .shape()
            .unwrap(),
        vec![256, 2048, 6144]
    );
}

#[test]
fn nested_shapes() {
    // kv_b_proj [H·(P+V), L] = [2·(4+3), 8], viewed per head and split into k and v parts.
    let kv_b = hf("kv_b_proj.weight", &[14, 8]);
    let per_head = kv_b.clone().reshape(vec![2, 7, 8]);
    assert_eq!(per_head.shape().unwrap(), vec![2, 7, 8]);
    let k = per_head.clone().slice(1, 0, 4);
    let v = per_head.clone().slice(1, 4, 7);
    assert_eq!(k.shape().unwrap(), vec![2, 4, 8]);
    assert_eq!(v.shape().unwrap(), vec![2, 3, 8]);
    // Absorbed: k transposed per head.
    let k_t = k.clone().transpose(vec![0, 2, 1]);
    assert_eq!(k_t.shape().unwrap(), vec![2, 8, 4]);
    // Fused gate+up of a stack: concat along the intermediate axis.
    let gate_up = Recipe::Concat {
        axis: 1,
        parts: vec![
            stack("e.{e}.gate_proj.weight", 4, &[8, 16]),
            stack("e.{e}.up_proj.weight", 4, &[8, 16]),
        ],
    };
    assert_eq!(gate_up.shape().unwrap(), vec![4, 16, 16]);
    // Deep nesting: transpose(reshape(concat(slice, slice))).
    let deep = Recipe::Concat {
        axis: 0,
        parts: vec![
            hf("a", &[10, 6]).slice(0, 2, 5),
            hf("b", &[4, 6]).slice(0, 0, 1),
        ],
    }
    .reshape(vec![2, 2, 6])
    .transpose(vec![2, 0, 1]);
    assert_eq!(deep.shape().unwrap(), vec![6, 2, 2]);
    // An empty slice is allowed in a recipe.
    assert_eq!(hf("a", &[3]).slice(0, 2, 2).shape().unwrap(), vec![0]);
}

#[test]
fn slice_errors() {
    assert_eq!(
        hf("w", &[8, 4]).slice(2, 0, 1).shape(),
        Err(RecipeError::Axis {
            op: "slice",
            axis: 2,
            shape: vec![8, 4]
        })
    );
    let e = hf("w", &[8, 4]).slice(1, 2, 5).shape().unwrap_err();
    assert_eq!(
        e,
        RecipeError::SliceBounds {
            axis: 1,
            start: 2,
            end: 5,
            shape: vec![8, 4]
        }
    );
    assert_eq!(
        e.to_string(),
        "slice 2..5 of axis 1 is outside shape [8, 4]"
    );
    assert!(matches!(
        hf("w", &[8, 4]).slice(0, 5, 3).shape(),
        Err(RecipeError::SliceBounds {
            start: 5,
            end: 3,
            ..
        })
    ));
    // Errors come up from deep inside.
    let inner = stack("no placeholder", 2, &[3])
        .slice(0, 0, 1)
        .reshape(vec![3]);
    assert_eq!(
        inner.shape(),
        Err(RecipeError::Pattern {
            pattern: "no placeholder".into()
        })
    );
    assert_eq!(
        stack("x", 2, &[3]).shape().unwrap_err().to_string(),
        "stack pattern \"x\" has no `{e}` placeholder"
    );
}

#[test]
fn concat_errors() {
    assert_eq!(
        Recipe::Concat {
            axis: 0,
            parts: vec![]
        }
        .shape(),
        Err(RecipeError::EmptyConcat)
    );
    let e = Recipe::Concat {
        axis: 1,
        parts: vec![hf("a", &[4, 2]), hf("b", &[5, 2])],
    }
    .shape()
    .unwrap_err();
    assert_eq!(
        e,
        RecipeError::ConcatMismatch {
            axis: 1,
            a: vec![4, 2],
            b: vec![5, 2]
        }
    );
    assert!(e.to_string().contains("differ off that axis"));
    // Rank mismatch.
    assert!(matches!(
        Recipe::Concat {
            axis: 0,
            parts: vec![hf("a", &[4, 2]), hf("b", &[4])],
        }
        .shape(),
        Err(RecipeError::ConcatMismatch { .. })
    ));
    assert_eq!(
        Recipe::Concat {
            axis: 2,
            parts: vec![hf("a", &[4, 2]), hf("b", &[4, 2])],
        }
        .shape(),
        Err(RecipeError::Axis {
            op: "concat",
            axis: 2,
            shape: vec![4, 2]
        })
    );
    // A bad part deep in the list is found.
    assert!(matches!(
        Recipe::Concat {
            axis: 0,
            parts: vec![hf("a", &[4]), hf("b", &[4]), hf("c", &[4]).slice(0, 0, 9)],
        }
        .shape(),
        Err(RecipeError::SliceBounds { end: 9, .. })
    ));
}

#[test]
fn reshape_errors() {
    let e = hf("w", &[6, 4]).reshape(vec![5, 5]).shape().unwrap_err();
    assert_eq!(
        e,
        RecipeError::Reshape {
            from: vec![6, 4],
            from_n: 24,
            to: vec![5, 5],
            to_n: 25
        }
    );
    assert_eq!(
        e.to_string(),
        "reshape of [6, 4] (24 elements) to [5, 5] (25 elements)"
    );
    assert_eq!(
        hf("w", &[6, 4]).reshape(vec![2, 3, 4]).shape().unwrap(),
        vec![2, 3, 4]
    );
}

#[test]
fn huge_shapes_are_errors_not_overflows() {
    // 2^32 · 2^32 wraps to 0 in u64; a [0] target must not pass for it.
    let big = 1u64 << 32;
    let e = hf("w", &[big, big]).reshape(vec![0]).shape().unwrap_err();
    assert!(
        matches!(e, RecipeError::Overflow { op: "reshape", .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("overflows"), "{e}");
    assert!(matches!(
        hf("w", &[big, big]).reshape(vec![big, big]).shape(),
        Err(RecipeError::Overflow { .. })
    ));
    let parts = vec![hf("a", &[u64::MAX]), hf("b", &[1])];
    assert!(matches!(
        Recipe::Concat { axis: 0, parts }.shape(),
        Err(RecipeError::Overflow { op: "concat", .. })
    ));
}

#[test]
fn transpose_errors() {
    let w = || hf("w", &[2, 3, 4]);
    assert_eq!(w().transpose(vec![1, 2, 0]).shape().unwrap(), vec![3, 4, 2]);
    for bad in [vec![0, 1], vec![0, 1, 1], vec![0, 1, 3], vec![0, 1, 2, 3]] {
        assert_eq!(
            w().transpose(bad.clone()).shape(),
            Err(RecipeError::Perm {
                perm: bad,
                shape: vec![2, 3, 4]
            })
        );
    }
}

#[test]
fn leaves_expand_stacks() {
    let r = Recipe::Concat {
        axis: 1,
        parts: vec![
            stack(
                "model.layers.3.mlp.experts.{e}.gate_proj.weight",
                3,
                &[8, 16],
            ),
            hf("extra", &[3, 2, 16]).transpose(vec![0, 1, 2]),
        ],
    };
    let leaves = r.leaves();
    let names: Vec<&str> = leaves.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "model.layers.3.mlp.experts.0.gate_proj.weight",
            "model.layers.3.mlp.experts.1.gate_proj.weight",
            "model.layers.3.mlp.experts.2.gate_proj.weight",
            "extra",
        ]
    );
    assert!(leaves[..3].iter().all(|(_, s)| s == &vec![8, 16]));
    assert_eq!(leaves[3].1, vec![3, 2, 16]);
    // `{e}` everywhere in the pattern is replaced.
    assert_eq!(Recipe::stack_member("{e}/x.{e}", 12), "12/x.12");
    // Slices, reshapes and transposes read the same leaves as their source.
    let w = hf("w", &[4, 4]);
    assert_eq!(
        w.clone().slice(0, 0, 2).reshape(vec![8]).leaves(),
        w.leaves()
    );
    assert_eq!(stack("p{e}", 0, &[1]).leaves(), vec![]);
}

#[test]
fn literal_form_round_trips() {
    let r = Recipe::Concat {
        axis: 1,
        parts: vec![
            stack("e.{e}.w", 4, &[8, 16]),
            hf("say \"hi\"\\n", &[4, 8, 16])
                .slice(0, 0, 4)
                .transpose(vec![0, 1, 2]),
            hf("r", &[512]).reshape(vec![4, 8, 16]),
        ],
    };
    let lit = r.to_lit();
    let mut text = String::new();
    lit.write(&mut text);
    assert_eq!(
        text,
        "concat(1, [stack(\"e.{e}.w\", 4, [8, 16]), \
         transpose(slice(hf(\"say \\\"hi\\\"\\\\n\", [4, 8, 16]), 0, 0, 4), [0, 1, 2]), \
         reshape(hf(\"r\", [512]), [4, 8, 16])])"
    );
    assert_eq!(Recipe::from_lit(&lit).unwrap(), r);
}

#[test]
fn literal_errors() {
    let call = |name: &str, args: Vec<Lit>| Lit::Call(name.into(), args);
    assert!(Recipe::from_lit(&Lit::Int(3))
        .unwrap_err()
        .contains("expected a recipe"));
    assert_eq!(
        Recipe::from_lit(&call("hf", vec![Lit::Str("w".into())])).unwrap_err(),
        "recipe `hf` takes 2 arguments, found 1"
    );
    assert!(Recipe::from_lit(&call("gather", vec![]))
        .unwrap_err()
        .contains("unknown recipe `gather`"));
    let e = Recipe::from_lit(&call(
        "hf",
        vec![Lit::Str("w".into()), Lit::List(vec![Lit::Int(-1)])],
    ))
    .unwrap_err();
    assert!(e.contains("-1 is not a non-negative"), "{e}");
}
