//! `kernels.cu`: the shared header and one rendered template per kernel specialisation.

use tera::{Context, Tera};

use crate::schedule::Kernel;

/// Every template, by name; each is a readable CUDA file with a small parameter block (`.cuh`:
/// a part other templates include).
pub const TEMPLATES: &[(&str, &str)] = &[
    ("attention", include_str!("../templates/attention.cu")),
    (
        "attention_flash",
        include_str!("../templates/attention_flash.cu"),
    ),
    ("cache", include_str!("../templates/cache.cu")),
    ("cache_norm", include_str!("../templates/cache_norm.cu")),
    ("copy", include_str!("../templates/copy.cu")),
    ("elementwise", include_str!("../templates/elementwise.cu")),
    ("dsa_score", include_str!("../templates/dsa_score.cu")),
    (
        "dsa_score_decode",
        include_str!("../templates/dsa_score_decode.cu"),
    ),
    (
        "dsa_score_mma",
        include_str!("../templates/dsa_score_mma.cu"),
    ),
    ("dsa_topk", include_str!("../templates/dsa_topk.cu")),
    (
        "dsa_topk_split",
        include_str!("../templates/dsa_topk_split.cu"),
    ),
    ("embed", include_str!("../templates/embed.cu")),
    ("gemm_argmax", include_str!("../templates/gemm_argmax.cu")),
    ("gemm_head.cuh", include_str!("../templates/gemm_head.cuh")),
    (
        "gemm_x_stage.cuh",
        include_str!("../templates/gemm_x_stage.cuh"),
    ),
    ("gemm_mma", include_str!("../templates/gemm_mma.cu")),
    ("gemm_skinny", include_str!("../templates/gemm_skinny.cu")),
    (
        "gemm_skinny_persistent",
        include_str!("../templates/gemm_skinny_persistent.cu"),
    ),
    ("gemv", include_str!("../templates/gemv.cu")),
    ("matmul", include_str!("../templates/matmul.cu")),
    ("mla_absorbed", include_str!("../templates/mla_absorbed.cu")),
    (
        "mla_absorbed_wide",
        include_str!("../templates/mla_absorbed_wide.cu"),
    ),
    (
        "mla_absorbed_wide64",
        include_str!("../templates/mla_absorbed_wide64.cu"),
    ),
    ("mla_block.cuh", include_str!("../templates/mla_block.cuh")),
    ("mla_head.cuh", include_str!("../templates/mla_head.cuh")),
    ("mla_keys.cuh", include_str!("../templates/mla_keys.cuh")),
    ("mla_out.cuh", include_str!("../templates/mla_out.cuh")),
    (
        "mla_scores.cuh",
        include_str!("../templates/mla_scores.cuh"),
    ),
    ("mla_pv.cuh", include_str!("../templates/mla_pv.cuh")),
    ("mla_merge", include_str!("../templates/mla_merge.cu")),
    ("mla_split.cuh", include_str!("../templates/mla_split.cuh")),
    (
        "dsa_topk_rank.cuh",
        include_str!("../templates/dsa_topk_rank.cuh"),
    ),
    (
        "dsa_topk_keys.cuh",
        include_str!("../templates/dsa_topk_keys.cuh"),
    ),
    (
        "norm_moments.cuh",
        include_str!("../templates/norm_moments.cuh"),
    ),
    ("moe_combine", include_str!("../templates/moe_combine.cu")),
    ("moe_experts", include_str!("../templates/moe_experts.cu")),
    ("moe_gemm_mma", include_str!("../templates/moe_gemm_mma.cu")),
    (
        "moe_gemm_skinny",
        include_str!("../templates/moe_gemm_skinny.cu"),
    ),
    (
        "moe_down_stream",
        include_str!("../templates/moe_down_stream.cu"),
    ),
    ("moe_route", include_str!("../templates/moe_route.cu")),
    ("moe_sort", include_str!("../templates/moe_sort.cu")),
    ("norm", include_str!("../templates/norm.cu")),
    ("rope", include_str!("../templates/rope.cu")),
    ("sample", include_str!("../templates/sample.cu")),
];

/// The helpers every kernel uses, at the top of `kernels.cu`.
pub const COMMON: &str = include_str!("../templates/common.cuh");

/// The first statement of every kernel (`common.cuh`): it waits for the kernel before it, so the
/// runtime may launch kernels as programmatic dependents of their predecessors.
pub const GRID_DEPENDENCY_CONTROL: &str = "grid_dependency_control();";

/// The first statement of a kernel that reads weights, and nothing else, before its
/// [`GRID_DEPENDENCY_CONTROL`] (`common.cuh`).
pub const WEIGHTS_BEFORE_WAIT: &str = "weights_before_wait();";

/// Whether every `__global__` function in `source` opens its body with
/// [`GRID_DEPENDENCY_CONTROL`], before any statement that could touch global memory, or with
/// [`WEIGHTS_BEFORE_WAIT`] and has the wait further on. A kernel's body opens with a brace on a
/// line of its own (a template's parameter list holds tera's braces).
pub fn kernels_wait_first(source: &str) -> bool {
    source.match_indices("__global__").all(|(at, _)| {
        source[at..].find("\n{\n").is_some_and(|open| {
            let body = source[at + open + 3..].trim_start();
            let end = body.find("\n}\n").unwrap_or(body.len());
            body.starts_with(GRID_DEPENDENCY_CONTROL)
                || (body.starts_with(WEIGHTS_BEFORE_WAIT)
                    && body[..end].contains(GRID_DEPENDENCY_CONTROL))
        })
    })
}

#[derive(Debug, thiserror::Error)]
#[error("rendering kernel {kernel} from template `{template}`: {message}")]
pub struct RenderError {
    pub kernel: String,
    pub template: String,
    pub message: String,
}

/// The source of every kernel, in order, after the shared header.
pub fn render(kernels: &[Kernel]) -> Result<String, RenderError> {
    let mut tera = Tera::default();
    tera.add_raw_templates(TEMPLATES.iter().copied())
        .map_err(|e| RenderError {
            kernel: String::new(),
            template: "*".into(),
            message: e.to_string(),
        })?;
    let mut out = String::from(COMMON);
    for k in kernels {
        let mut cx = Context::new();
        cx.insert("name", &k.name);
        cx.insert("threads", &k.threads);
        cx.insert("shared_bytes", &k.shared_bytes);
        for (key, value) in &k.params {
            match value.as_str() {
                "true" => cx.insert(key.clone(), &true),
                "false" => cx.insert(key.clone(), &false),
                _ => cx.insert(key.clone(), value),
            }
        }
        let text = tera.render(&k.template, &cx).map_err(|e| RenderError {
            kernel: k.name.clone(),
            template: k.template.clone(),
            message: format!("{e:?}"),
        })?;
        // A kernel launched programmatically that reads or writes memory before its wait
        // races the kernel before it, so none may reach the artifact.
        if !kernels_wait_first(&text) {
            return Err(RenderError {
                kernel: k.name.clone(),
                template: k.template.clone(),
                message: format!(
                    "the kernel's body does not begin with `{GRID_DEPENDENCY_CONTROL}`"
                ),
            });
        }
        out.push('\n');
        out.push_str(&text);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_touching_memory_before_its_wait_is_found() {
        let late = "extern \"C\" __global__ void k(float* y)\n{\n    y[0] = 1.f;\n    grid_dependency_control();\n}\n";
        assert!(!kernels_wait_first(late));
        let first = late.replace(
            "    y[0] = 1.f;\n    grid_dependency_control();",
            "    grid_dependency_control();\n    y[0] = 1.f;",
        );
        assert!(kernels_wait_first(&first));
    }

    #[test]
    fn a_kernel_reading_weights_first_must_still_wait() {
        let early = "extern \"C\" __global__ void k(float* y, const float* w)\n{\n    weights_before_wait();\n    float a = w[0];\n    grid_dependency_control();\n    y[0] = a;\n}\n";
        assert!(kernels_wait_first(early));
        let never = early.replace("    grid_dependency_control();\n", "");
        assert!(!kernels_wait_first(&never));
    }

    #[test]
    fn the_helper_waits_before_it_lets_the_next_kernel_launch() {
        let body = &COMMON[COMMON
            .find("void grid_dependency_control()")
            .expect("the helper")..];
        let wait = body.find("griddepcontrol.wait;").expect("a wait");
        let launch = body
            .find("griddepcontrol.launch_dependents;")
            .expect("a launch_dependents");
        assert!(wait < launch);
    }
}
