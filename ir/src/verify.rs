//! The verifier: arity, operand wiring, acyclicity, unique names, declared state, and shape and
//! dtype inference for every op. Errors name the function, the node, the op and the operand types.

use std::collections::HashSet;

use petgraph::algo::toposort;
use petgraph::Direction;

use crate::graph::{Function, Module};
use crate::ops::Op;
use crate::{DType, Dim, TensorType};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    #[error("@{function}: node \"{node}\" ({op} of {}): {message}", fmt_types(.operands))]
    Node {
        function: String,
        node: String,
        op: String,
        operands: Vec<TensorType>,
        message: String,
    },
    #[error("@{function}: {message}")]
    Graph { function: String, message: String },
}

fn fmt_types(types: &[TensorType]) -> String {
    if types.is_empty() {
        return "no operands".to_string();
    }
    types
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl VerifyError {
    pub fn node(
        function: &str,
        node: &str,
        op: &Op,
        operands: &[&TensorType],
        message: String,
    ) -> VerifyError {
        VerifyError::Node {
            function: function.to_string(),
            node: node.to_string(),
            op: op.name().to_string(),
            operands: operands.iter().map(|t| (*t).clone()).collect(),
            message,
        }
    }
}

pub fn verify_module(module: &Module) -> Result<(), VerifyError> {
    let mut names = HashSet::new();
    for f in &module.functions {
        if !names.insert(&f.name) {
            return Err(VerifyError::Graph {
                function: f.name.clone(),
                message: "a second function of this name".into(),
            });
        }
        verify_function(module, f)?;
    }
    Ok(())
}

pub fn verify_function(module: &Module, f: &Function) -> Result<(), VerifyError> {
    let graph_err = |message: String| VerifyError::Graph {
        function: f.name.clone(),
        message,
    };
    if let Err(cycle) = toposort(&f.graph, None) {
        let n = cycle.node_id();
        let operands = f.operands(n);
        let types: Vec<&TensorType> = operands
            .iter()
            .filter_map(|v| f.graph[v.node].outputs.get(v.output as usize))
            .collect();
        let node = &f.graph[n];
        return Err(VerifyError::node(
            &f.name,
            &node.name,
            &node.op,
            &types,
            "the node is on a cycle".into(),
        ));
    }
    let mut names = HashSet::new();
    let inputs = f.inputs();
    for (i, &n) in inputs.iter().enumerate() {
        let node = &f.graph[n];
        let Op::Input { index } = node.op else {
            continue;
        };
        if index != i as u64 {
            return Err(VerifyError::node(
                &f.name,
                &node.name,
                &node.op,
                &[],
                format!(
                    "argument index {index}, but arguments must be numbered 0..{} without gaps",
                    inputs.len()
                ),
            ));
        }
    }
    for n in f.graph.node_indices() {
        let node = &f.graph[n];
        let mut indices: Vec<u32> = f
            .graph
            .edges_directed(n, Direction::Incoming)
            .map(|e| e.weight().index)
            .collect();
        indices.sort();
        let operands = f.operands(n);
        let types: Vec<&TensorType> = operands
            .iter()
            .filter_map(|v| f.graph[v.node].outputs.get(v.output as usize))
            .collect();
        let fail = |message: String| {
            Err(VerifyError::node(
                &f.name, &node.name, &node.op, &types, message,
            ))
        };
        if !names.insert(node.name.as_str()) {
            return fail(format!(
                "two nodes are named \"{}\"; names must be unique",
                node.name
            ));
        }
        if indices.iter().enumerate().any(|(i, &k)| i as u32 != k) {
            return fail(format!(
                "operand slots {indices:?} are not 0..{} (a dangling or doubled edge)",
                indices.len()
            ));
        }
        if types.len() != operands.len() {
            return fail("an operand reads an output its producer does not have".into());
        }
        let arity = node.op.arity();
        if !arity.accepts(operands.len()) {
            return fail(format!("takes {arity} operands, has {}", operands.len()));
        }
        let inferred = match &node.op {
            Op::Input { .. } | Op::Weight { .. } => input_or_weight(&node.op, &node.outputs),
            op => infer(op, &types),
        };
        // Each cache's rows (the output without its leading batch and position axes) must be
        // the rows its state holds.
        if let Ok(outputs) = &inferred {
            let skip = if node.op.batched_cache() { 2 } else { 1 };
            for (state, written) in node.op.cache_states().iter().zip(outputs) {
                let Some(row) = module.states.get(state) else {
                    return fail(format!(
                        "cache state \"{state}\" is not declared in the module"
                    ));
                };
                let new_row = &written.shape[skip.min(written.shape.len())..];
                if row.dtype != written.dtype || row.shape != new_row {
                    return fail(format!(
                        "cache state \"{state}\" holds rows of {row}, the update writes rows of {}",
                        written.with_shape(new_row.to_vec())
                    ));
                }
            }
        }
        match inferred {
            Ok(outputs) if outputs == node.outputs => {}
            Ok(outputs) => {
                return fail(format!(
                    "declared output {} but the operands give {}",
                    fmt_types(&node.outputs),
                    fmt_types(&outputs)
                ))
            }
            Err(message) => return fail(message),
        }
    }
    for (name, v) in &f.results {
        if !f.graph.contains_node(v.node) || f.graph[v.node].outputs.len() <= v.output as usize {
            return Err(graph_err(format!(
                "result \"{name}\" reads a value that does not exist"
            )));
        }
    }
    Ok(())
}

fn input_or_weight(op: &Op, outputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
    if outputs.len() != 1 {
        return Err(format!("has {} outputs, must have one", outputs.len()));
    }
    if let Op::Weight { recipe } = op {
        let shape = recipe.shape().map_err(|e| format!("recipe: {e}"))?;
        let made = outputs[0].with_shape(shape.into_iter().map(Dim::Const).collect());
        if made != outputs[0] {
            return Err(format!(
                "the recipe gives {made}, the node declares {}",
                outputs[0]
            ));
        }
    }
    Ok(outputs.to_vec())
}

fn same_dim(what: &str, a: &Dim, b: &Dim) -> Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err(format!("{what} differ: {a} vs {b}"))
    }
}

/// The constant extent of axis `axis` of `t`, which the op (`verb`: "slice", …) needs.
fn const_axis(t: &TensorType, axis: u64, verb: &str) -> Result<u64, String> {
    match t.shape.get(axis as usize) {
        None => Err(format!("axis {axis} out of range for {t}")),
        Some(Dim::Const(n)) => Ok(*n),
        Some(d) => Err(format!("cannot {verb} symbolic dim {d} of {t}")),
    }
}

fn rank(what: &str, t: &TensorType, r: std::ops::RangeInclusive<usize>) -> Result<(), String> {
    if r.contains(&t.rank()) {
        Ok(())
    } else if r.start() == r.end() {
        Err(format!("{what} must have rank {}, has {t}", r.start()))
    } else {
        Err(format!(
            "{what} must have rank {} to {}, has {t}",
            r.start(),
            r.end()
        ))
    }
}

fn float(what: &str, t: &TensorType) -> Result<(), String> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be a float tensor, is {t}"))
    }
}

fn int(what: &str, t: &TensorType) -> Result<(), String> {
    if t.dtype.is_float() {
        Err(format!("{what} must be an integer tensor, is {t}"))
    } else {
        Ok(())
    }
}

fn same_dtype(a: &TensorType, b: &TensorType) -> Result<(), String> {
    if a.dtype == b.dtype {
        Ok(())
    } else {
        Err(format!(
            "dtypes differ: {} vs {} (insert a cast)",
            a.dtype, b.dtype
        ))
    }
}

fn last(t: &TensorType) -> &Dim {
    t.shape.last().expect("rank checked by the caller")
}

/// Positions: one integer per query row.
fn positions(t: &TensorType, rows: &Dim) -> Result<(), String> {
    int("positions", t)?;
    rank("positions", t, 1..=1)?;
    same_dim("positions and query rows", &t.shape[0], rows)
}

/// A cache read by attention: `[t, tail..]`, or `[b, t, tail..]` with `b` = query rows.
fn cache(what: &str, t: &TensorType, tail: usize, rows: &Dim) -> Result<Dim, String> {
    rank(what, t, tail + 1..=tail + 2)?;
    if t.rank() == tail + 2 {
        same_dim(&format!("{what} batch and query rows"), &t.shape[0], rows)?;
    }
    Ok(t.shape[t.rank() - tail - 1].clone())
}

/// Const product and sorted symbols, to compare element counts of symbolic shapes; `None` when
/// the const product overflows `u64`.
fn numel_key(shape: &[Dim]) -> Option<(u64, Vec<&str>)> {
    let mut n: u64 = 1;
    let mut syms = Vec::new();
    for d in shape {
        match d {
            Dim::Const(k) => n = n.checked_mul(*k)?,
            Dim::Sym(s) => syms.push(s.as_str()),
        }
    }
    syms.sort();
    Some((n, syms))
}

/// The output types of `op` applied to operands of types `x`. Arity is checked by the caller.
pub fn infer(op: &Op, x: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    if !op.arity().accepts(x.len()) {
        return Err(format!("takes {} operands, has {}", op.arity(), x.len()));
    }
    let one = |t: TensorType| Ok(vec![t]);
    match op {
        Op::Input { .. } | Op::Weight { .. } => Err("inputs and weights declare their type".into()),
        Op::Embed {} => {
            rank("table", x[0], 2..=2)?;
            float("table", x[0])?;
            int("ids", x[1])?;
            let mut shape = x[1].shape.clone();
            shape.push(x[0].shape[1].clone());
            one(TensorType::new(x[0].dtype, shape))
        }
        Op::EmbedShard { .. } => infer(&Op::Embed {}, x),
        Op::AllReduce { ranks, .. } => {
            float("x", x[0])?;
            if *ranks == 0 {
                return Err("ranks must be positive".into());
            }
            one(x[0].clone())
        }
        Op::AllGather { axis, ranks } => {
            let a = *axis as usize;
            let n = &const_axis(x[0], *axis, "gather along")?;
            if *ranks == 0 {
                return Err("ranks must be positive".into());
            }
            let total = n
                .checked_mul(*ranks)
                .ok_or_else(|| format!("gathering {ranks} × {n} overflows 64 bits"))?;
            let mut shape = x[0].shape.clone();
            shape[a] = Dim::Const(total);
            one(x[0].with_shape(shape))
        }
        Op::Matmul {} => {
            rank("x", x[0], 1..=4)?;
            rank("w", x[1], 2..=2)?;
            float("x", x[0])?;
            let widened =
                matches!(x[0].dtype, DType::BF16 | DType::F16) && x[1].dtype == DType::F32;
            if !widened {
                same_dtype(x[0], x[1])?;
            }
            same_dim("inner dims of x and w", last(x[0]), &x[1].shape[1])?;
            let mut shape = x[0].shape.clone();
            *shape.last_mut().unwrap() = x[1].shape[0].clone();
            one(TensorType::new(x[1].dtype, shape))
        }
        Op::MatmulHeads {} => {
            rank("x", x[0], 2..=4)?;
            rank("w", x[1], 3..=3)?;
            float("x", x[0])?;
            same_dtype(x[0], x[1])?;
            let r = x[0].rank();
            same_dim("heads of x and w", &x[0].shape[r - 2], &x[1].shape[0])?;
            same_dim("inner dims of x and w", &x[0].shape[r - 1], &x[1].shape[2])?;
            let mut shape = x[0].shape.clone();
            shape[r - 1] = x[1].shape[1].clone();
            one(x[0].with_shape(shape))
        }
        Op::Add {} | Op::Mul {} => {
            float("lhs", x[0])?;
            same_dtype(x[0], x[1])?;
            if !x[0].shape.ends_with(&x[1].shape) {
                return Err(format!(
                    "rhs shape {} is not a trailing part of lhs shape {}",
                    x[1], x[0]
                ));
            }
            one(x[0].clone())
        }
        Op::Swiglu {} => {
            float("g", x[0])?;
            if x[0] != x[1] {
                return Err(format!("g {} and u {} must have one type", x[0], x[1]));
            }
            one(x[0].clone())
        }
        Op::Scale { .. } | Op::Silu {} | Op::Relu {} => {
            float("x", x[0])?;
            one(x[0].clone())
        }
        Op::Cast { dtype } => one(x[0].with_dtype(*dtype)),
        Op::RmsNorm { .. } | Op::LayerNorm { .. } => {
            float("x", x[0])?;
            rank("x", x[0], 1..=4)?;
            for w in &x[1..] {
                rank("weight", w, 1..=1)?;
                same_dtype(x[0], w)?;
                same_dim("normalised dim and weight", last(x[0]), &w.shape[0])?;
            }
            one(x[0].clone())
        }
        Op::AddRmsNorm { eps } => {
            // Exactly the add's and then the norm's rules, so the fused node accepts what the
            // pair did.
            let sum = infer(&Op::Add {}, &x[..2])?.remove(0);
            let normed = infer(&Op::RmsNorm { eps: *eps }, &[&sum, x[2]])?.remove(0);
            Ok(vec![normed, sum])
        }
        Op::Rope { .. } => {
            float("x", x[0])?;
            rank("x", x[0], 2..=4)?;
            positions(x[1], &x[0].shape[0])?;
            match last(x[0]) {
                Dim::Const(r) if r % 2 == 0 => one(x[0].clone()),
                d => Err(format!("rotary dim {d} must be an even constant")),
            }
        }
        Op::MatmulRope {
            period, start, end, ..
        } => {
            // The rope epilogue's GEMMs take one dtype.
            same_dtype(x[0], x[1])?;
            let out = infer(&Op::Matmul {}, &x[..2])?.remove(0);
            rank("output", &out, 2..=4)?;
            positions(x[2], &out.shape[0])?;
            let n = last(&out)
                .as_const()
                .ok_or_else(|| format!("cannot rotate columns of symbolic width in {out}"))?;
            if *period == 0 || n % period != 0 {
                return Err(format!(
                    "period {period} does not divide the {n} output columns"
                ));
            }
            if start >= end || end > period || (end - start) % 2 != 0 {
                return Err(format!(
                    "rotated columns {start}..{end} must be a non-empty even range within the period {period}"
                ));
            }
            one(out)
        }
        Op::Reshape { shape } => {
            let to = x[0].with_shape(shape.clone());
            let (Some(a), Some(b)) = (numel_key(shape), numel_key(&x[0].shape)) else {
                return Err(format!(
                    "cannot reshape {} to {to}: the element count overflows 64 bits",
                    x[0]
                ));
            };
            if a != b {
                return Err(format!(
                    "cannot reshape {} to {to}: element counts differ",
                    x[0]
                ));
            }
            one(x[0].with_shape(shape.clone()))
        }
        Op::Slice { axis, start, end } => {
            let a = *axis as usize;
            let n = &const_axis(x[0], *axis, "slice")?;
            if start >= end || end > n {
                return Err(format!(
                    "slice {start}..{end} of axis {axis} is outside {}",
                    x[0]
                ));
            }
            let mut shape = x[0].shape.clone();
            shape[a] = Dim::Const(end - start);
            one(x[0].with_shape(shape))
        }
        Op::Concat { axis } => {
            let a = *axis as usize;
            if a >= x[0].rank() {
                return Err(format!("axis {axis} out of range for {}", x[0]));
            }
            let mut total = 0;
            for t in x {
                same_dtype(x[0], t)?;
                let off_axis_equal = t.rank() == x[0].rank()
                    && t.shape
                        .iter()
                        .zip(&x[0].shape)
                        .enumerate()
                        .all(|(i, (p, q))| i == a || p == q);
                if !off_axis_equal {
                    return Err(format!("{t} and {} differ off axis {axis}", x[0]));
                }
                let d = t.shape[a]
                    .as_const()
                    .ok_or_else(|| format!("cannot concat symbolic dim of {t}"))?;
                total = d
                    .checked_add(total)
                    .ok_or_else(|| format!("concat along axis {axis} overflows 64 bits"))?;
            }
            let mut shape = x[0].shape.clone();
            shape[a] = Dim::Const(total);
            one(x[0].with_shape(shape))
        }
        Op::SliceLast {} => {
            if x[0].rank() == 0 {
                return Err(format!("a scalar {} has no rows to take", x[0]));
            }
            let mut shape = x[0].shape.clone();
            shape[0] = Dim::Const(1);
            one(x[0].with_shape(shape))
        }
        Op::CacheUpdate { batched, .. } => {
            rank("new rows", x[0], 1..=3)?;
            positions(x[1], &x[0].shape[0])?;
            if let Some(slot) = x.get(2) {
                int("slot", slot)?;
                rank("slot", slot, 1..=1)?;
                same_dim("slot rows", &slot.shape[0], &Dim::Const(1))?;
            }
            let mut shape = if *batched {
                vec![x[0].shape[0].clone(), Dim::sym("t")]
            } else {
                vec![Dim::sym("t")]
            };
            shape.extend(x[0].shape[1..].iter().cloned());
            one(x[0].with_shape(shape))
        }
        Op::CacheUpdateNorm {
            batched,
            eps,
            layernorm,
            rope,
            states,
        } => {
            let p = op.positions_operand().expect("a cache op");
            float("x", x[0])?;
            rank("x", x[0], 2..=2)?;
            let cols = const_axis(x[0], 1, "normalise")?;
            let normed = const_axis(x[1], 0, "normalise")?;
            let norm = if *layernorm {
                Op::LayerNorm { eps: *eps }
            } else {
                Op::RmsNorm { eps: *eps }
            };
            let mut row = x[0].clone();
            row.shape[1] = Dim::Const(normed);
            infer(&norm, &[&[&row][..], &x[1..p]].concat())?;
            if normed > cols {
                return Err(format!("{normed} normalised columns of {} columns", x[0]));
            }
            let wanted = if normed < cols { 2 } else { 1 };
            if states.len() != wanted {
                return Err(format!(
                    "{normed} of {cols} columns normalised write {wanted} states, not {}",
                    states.len()
                ));
            }
            if let Some(r) = rope {
                if r.start >= r.end || r.end > normed || (r.end - r.start) % 2 != 0 {
                    return Err(format!(
                        "rope columns {}..{} are not an even span of the {normed} normalised",
                        r.start, r.end
                    ));
                }
            }
            let update = Op::CacheUpdate {
                batched: *batched,
                state: String::new(),
            };
            let mut caches = infer(&update, &[&[&row][..], &x[p..]].concat())?;
            if normed < cols {
                let mut tail = x[0].clone();
                tail.shape[1] = Dim::Const(cols - normed);
                caches.extend(infer(&update, &[&[&tail][..], &x[p..]].concat())?);
            }
            Ok(caches)
        }
        Op::MlaAttend { sparse, .. } => {
            let (q_nope, q_pe, k_nope, k_pe, v) = (x[0], x[1], x[2], x[3], x[4]);
            rank("q_nope", q_nope, 3..=3)?;
            rank("q_pe", q_pe, 3..=3)?;
            let (n, h) = (&q_nope.shape[0], &q_nope.shape[1]);
            same_dim("q_nope and q_pe rows/heads", &q_pe.shape[0], n).and(same_dim(
                "heads",
                &q_pe.shape[1],
                h,
            ))?;
            let t = cache("k_nope", k_nope, 2, n)?;
            same_dim("k_pe and k_nope context", &cache("k_pe", k_pe, 1, n)?, &t)?;
            same_dim("v and k_nope context", &cache("v", v, 2, n)?, &t)?;
            let kr = k_nope.rank();
            same_dim("heads of q and k", &k_nope.shape[kr - 2], h)?;
            same_dim("heads of q and v", &v.shape[v.rank() - 2], h)?;
            same_dim("nope dims of q and k", last(k_nope), last(q_nope))?;
            same_dim("rope dims of q and k", last(k_pe), last(q_pe))?;
            positions(x[5], n)?;
            if *sparse {
                topk_indices(x[6], n)?;
            }
            for t in [q_pe, k_nope, k_pe, v] {
                same_dtype(q_nope, t)?;
            }
            one(TensorType::new(
                q_nope.dtype,
                vec![n.clone(), h.clone(), last(v).clone()],
            ))
        }
        Op::MlaAttendAbsorbed { sparse, .. } => {
            let (q_abs, q_pe, c_kv, k_pe) = (x[0], x[1], x[2], x[3]);
            rank("q_abs", q_abs, 3..=3)?;
            rank("q_pe", q_pe, 3..=3)?;
            let (n, h) = (&q_abs.shape[0], &q_abs.shape[1]);
            same_dim("q_abs and q_pe rows", &q_pe.shape[0], n).and(same_dim(
                "heads",
                &q_pe.shape[1],
                h,
            ))?;
            let t = cache("c_kv", c_kv, 1, n)?;
            same_dim("k_pe and c_kv context", &cache("k_pe", k_pe, 1, n)?, &t)?;
            same_dim("latent dims of q_abs and c_kv", last(c_kv), last(q_abs))?;
            same_dim("rope dims of q and k", last(k_pe), last(q_pe))?;
            positions(x[4], n)?;
            if *sparse {
                topk_indices(x[5], n)?;
            }
            for t in [q_pe, c_kv, k_pe] {
                same_dtype(q_abs, t)?;
            }
            one(q_abs.clone())
        }
        Op::DsaScore { .. } => {
            let (q, w, k) = (x[0], x[1], x[2]);
            rank("q", q, 3..=3)?;
            rank("w", w, 2..=2)?;
            let n = &q.shape[0];
            same_dim("rows of q and w", &w.shape[0], n)?;
            same_dim("heads of q and w", &w.shape[1], &q.shape[1])?;
            let t = cache("k", k, 1, n)?;
            same_dim("dims of q and k", last(k), last(q))?;
            positions(x[3], n)?;
            float("q", q).and(float("w", w)).and(float("k", k))?;
            one(TensorType::new(DType::F32, vec![n.clone(), t]))
        }
        Op::DsaTopk { k } => {
            rank("scores", x[0], 2..=2)?;
            float("scores", x[0])?;
            positions(x[1], &x[0].shape[0])?;
            if *k == 0 {
                return Err("k must be positive".into());
            }
            one(TensorType::new(
                DType::I64,
                vec![x[0].shape[0].clone(), Dim::Const(*k)],
            ))
        }
        Op::MoeRoute {
            n_group,
            top_k,
            topk_group,
            ..
        } => {
            rank("logits", x[0], 2..=2)?;
            rank("bias", x[1], 1..=1)?;
            if x[0].dtype != DType::F32 || x[1].dtype != DType::F32 {
                return Err("router logits and bias must be f32".into());
            }
            same_dim("experts of logits and bias", &x[1].shape[0], &x[0].shape[1])?;
            let e = x[0].shape[1]
                .as_const()
                .ok_or("the expert count must be constant")?;
            if *n_group == 0 || e % n_group != 0 || *topk_group == 0 || topk_group > n_group {
                return Err(format!(
                    "{e} experts cannot form {n_group} groups keeping {topk_group}"
                ));
            }
            if *top_k == 0 || *top_k > topk_group * (e / n_group) {
                return Err(format!(
                    "top_k {top_k} exceeds the {} experts of the kept groups",
                    topk_group * (e / n_group)
                ));
            }
            let shape = vec![x[0].shape[0].clone(), Dim::Const(*top_k)];
            Ok(vec![
                TensorType::new(DType::F32, shape.clone()),
                TensorType::new(DType::I64, shape),
            ])
        }
        Op::MoeExperts {} => {
            let (h, w, idx, gate, up, down) = (x[0], x[1], x[2], x[3], x[4], x[5]);
            rank("x", h, 2..=2)?;
            rank("weights", w, 2..=2)?;
            int("experts", idx)?;
            if w.shape != idx.shape {
                return Err(format!("weights {w} and experts {idx} differ in shape"));
            }
            same_dim("rows of x and weights", &w.shape[0], &h.shape[0])?;
            for (what, t) in [("gate", gate), ("up", up), ("down", down)] {
                rank(what, t, 3..=3)?;
                same_dtype(h, t)?;
            }
            if gate.shape != up.shape {
                return Err(format!("gate {gate} and up {up} differ in shape"));
            }
            same_dim("experts of gate and down", &down.shape[0], &gate.shape[0])?;
            same_dim("hidden dims of x and gate", &gate.shape[2], &h.shape[1])?;
            same_dim("hidden dims of x and down", &down.shape[1], &h.shape[1])?;
            same_dim(
                "intermediate dims of gate and down",
                &down.shape[2],
                &gate.shape[1],
            )?;
            one(h.clone())
        }
        Op::MoeSort { experts } => {
            rank("experts", x[0], 2..=2)?;
            int("experts", x[0])?;
            if *experts == 0 {
                return Err("the expert count must be positive".into());
            }
            let pairs = TensorType::new(DType::I64, x[0].shape.clone());
            Ok(vec![
                TensorType::new(DType::I64, vec![Dim::Const(experts + 1)]),
                pairs.clone(),
                pairs,
            ])
        }
        Op::MoeGateUp {} => {
            let (h, order, offsets, gate, up) = (x[0], x[1], x[2], x[3], x[4]);
            rank("x", h, 2..=2)?;
            float("x", h)?;
            routed_rows(order, offsets, &h.shape[0], gate)?;
            for (what, t) in [("gate", gate), ("up", up)] {
                rank(what, t, 3..=3)?;
                same_dtype(h, t)?;
            }
            if gate.shape != up.shape {
                return Err(format!("gate {gate} and up {up} differ in shape"));
            }
            same_dim("hidden dims of x and gate", &gate.shape[2], &h.shape[1])?;
            let mut shape = order.shape.clone();
            shape.push(gate.shape[1].clone());
            one(h.with_shape(shape))
        }
        Op::MoeDown {} => {
            let (h, offsets, down) = (x[0], x[1], x[2]);
            rank("h", h, 3..=3)?;
            float("h", h)?;
            rank("down", down, 3..=3)?;
            same_dtype(h, down)?;
            let order = TensorType::new(DType::I64, h.shape[..2].to_vec());
            routed_rows(&order, offsets, &h.shape[0], down)?;
            same_dim(
                "intermediate dims of h and down",
                &down.shape[2],
                &h.shape[2],
            )?;
            let mut shape = h.shape.clone();
            shape[2] = down.shape[1].clone();
            one(h.with_shape(shape))
        }
        Op::MoeCombine { shared } => {
            let (rows, position, weights) = (x[0], x[1], x[2]);
            rank("rows", rows, 3..=3)?;
            float("rows", rows)?;
            int("position", position)?;
            if weights.dtype != DType::F32 {
                return Err(format!("the routing weights must be f32, are {weights}"));
            }
            if position.shape != weights.shape || position.shape[..] != rows.shape[..2] {
                return Err(format!(
                    "position {position} and weights {weights} must be the [n,k] of rows {rows}"
                ));
            }
            let out = rows.with_shape(vec![rows.shape[0].clone(), rows.shape[2].clone()]);
            if *shared && *x[3] != out {
                return Err(format!("the shared output {} must be {out}", x[3]));
            }
            one(out)
        }
        Op::MatmulArgmax {} => {
            rank("x", x[0], 2..=2)?;
            same_dtype(x[0], x[1])?;
            let logits = infer(&Op::Matmul {}, x)?.remove(0);
            let n = logits_rows(&logits)?;
            one(TensorType::new(DType::I64, vec![n]))
        }
        Op::SampleArgmax {} => {
            let n = logits_rows(x[0])?;
            one(TensorType::new(DType::I64, vec![n]))
        }
        Op::SampleTopP {} => {
            let n = logits_rows(x[0])?;
            for (what, t) in [("temperature", x[1]), ("top_p", x[2]), ("uniform", x[3])] {
                if t.dtype != DType::F32 || t.rank() != 1 {
                    return Err(format!("{what} must be f32[{n}], one per row, is {t}"));
                }
                same_dim(&format!("{what} and logits rows"), &t.shape[0], &n)?;
            }
            one(TensorType::new(DType::I64, vec![n]))
        }
    }
}

/// `order [n,k]` and `offsets i64 [E+1]` of `moe.sort` over the `n` tokens, for the stacked
/// expert weights `w [E,..]`.
fn routed_rows(
    order: &TensorType,
    offsets: &TensorType,
    n: &Dim,
    w: &TensorType,
) -> Result<(), String> {
    rank("order", order, 2..=2)?;
    int("order", order)?;
    same_dim("tokens of x and order", &order.shape[0], n)?;
    rank("offsets", offsets, 1..=1)?;
    int("offsets", offsets)?;
    let e = w.shape[0]
        .as_const()
        .ok_or_else(|| format!("the expert count of {w} must be constant"))?;
    if offsets.shape[0] != Dim::Const(e + 1) {
        return Err(format!(
            "offsets {offsets} must have {} entries for {w}",
            e + 1
        ));
    }
    Ok(())
}

/// The rows of `logits [n, V]` for a sampler.
fn logits_rows(t: &TensorType) -> Result<Dim, String> {
    rank("logits", t, 2..=2)?;
    float("logits", t)?;
    Ok(t.shape[0].clone())
}

fn topk_indices(t: &TensorType, rows: &Dim) -> Result<(), String> {
    int("topk", t)?;
    rank("topk", t, 2..=2)?;
    same_dim("topk rows and query rows", &t.shape[0], rows)
}
