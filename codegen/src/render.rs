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
    ("embed", include_str!("../templates/embed.cu")),
    ("gemm_argmax", include_str!("../templates/gemm_argmax.cu")),
    ("gemm_head.cuh", include_str!("../templates/gemm_head.cuh")),
    ("gemm_mma", include_str!("../templates/gemm_mma.cu")),
    ("gemm_skinny", include_str!("../templates/gemm_skinny.cu")),
    ("gemv", include_str!("../templates/gemv.cu")),
    ("matmul", include_str!("../templates/matmul.cu")),
    ("mla_absorbed", include_str!("../templates/mla_absorbed.cu")),
    ("mla_merge", include_str!("../templates/mla_merge.cu")),
    ("moe_combine", include_str!("../templates/moe_combine.cu")),
    ("moe_experts", include_str!("../templates/moe_experts.cu")),
    ("moe_gemm_mma", include_str!("../templates/moe_gemm_mma.cu")),
    (
        "moe_gemm_skinny",
        include_str!("../templates/moe_gemm_skinny.cu"),
    ),
    ("moe_route", include_str!("../templates/moe_route.cu")),
    ("moe_sort", include_str!("../templates/moe_sort.cu")),
    ("norm", include_str!("../templates/norm.cu")),
    ("rope", include_str!("../templates/rope.cu")),
    ("sample", include_str!("../templates/sample.cu")),
];

/// The helpers every kernel uses, at the top of `kernels.cu`.
pub const COMMON: &str = include_str!("../templates/common.cuh");

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
        out.push('\n');
        out.push_str(&text);
    }
    Ok(out)
}
