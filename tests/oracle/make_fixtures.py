#!/usr/bin/env python3
"""Make the transformers oracle fixtures for glmc (tests/oracle/fixtures/<case>/).

Each case is a tiny random GLM-5 (`glm_moe_dsa`) model built with transformers'
`GlmMoeDsaForCausalLM`. For each case this script writes

    config.json, generation_config.json, model.safetensors   (save_pretrained, float32 weights)
    oracle.safetensors                                       (tokens, prompt, generated, logits, ...)
    checks.json                                              (seed, check numbers, weight key list)

and, for the `sparse` case only, a tiny BPE `tokenizer.json` plus a text prompt and its greedy
continuation. See tests/oracle/README.md for the formats and the check rules.

Needs: torch, transformers 5.17 (GlmMoeDsa*), tokenizers, safetensors. No network, no GPU: all
computation is float64 on CPU. Usage:

    PYTHONUNBUFFERED=1 python3 tests/oracle/make_fixtures.py --out tests/oracle/fixtures

Two logits tensors are written per case:
  * `logits`        : stock transformers, model in float64. NOTE: HF itself computes RMSNorm, the
                      RoPE tables, the router and the indexer in float32 inside a float64 model,
                      so these logits carry ~1e-6 of float32 rounding.
  * `logits_pure64` : the same HF code with exactly those float32 casts turned into float64 (by a
                      mechanical token rewrite of HF's own method source, see `pure64_patches`),
                      so an f64 implementation can be compared to ~1e-10.
Both come from the same float32-representable weights that are saved in model.safetensors.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import inspect
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import textwrap

import torch

import safetensors
import tokenizers
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import DynamicCache, GlmMoeDsaConfig, GlmMoeDsaForCausalLM
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as hf

# ----------------------------------------------------------------------------------------------
# Thresholds (documented in README.md)
# ----------------------------------------------------------------------------------------------

# Tie-gap rule: for every top-k the model relies on, (v_k - v_{k+1}) / max|v| >= GAP_REL, where
# v is the sorted row of candidate scores (indexer: causal keys of that query row; router: the
# selection scores sigmoid+bias of that token, restricted to the kept groups; groups: the group
# scores; greedy: the logits row). 1e-3 is ~1000x the float32 rounding of HF's own indexer/router,
# so any f32/f64 implementation picks the same sets. bf16 implementations may still flip.
GAP_REL = 1e-3
# Cached decode (HF DynamicCache, step by step) vs one full forward over all T tokens, max abs diff on logits.
DECODE_TOL_PURE64 = 1e-8   # pure float64 path
DECODE_TOL_STOCK = 1e-4    # stock HF (float32 internals); measured values are ~1e-6
# Negative control: NeoX (half-split) rope in the indexer must move logits by more than this in
# sparse cases, and by at most NEG_DENSE_TOL in the dense-equivalent case.
NEG_MIN_EFFECT = 1e-2
NEG_DENSE_TOL = 1e-12
MAX_SEED_TRIES = 2000

VOCAB = 256
EOS_ID = 0   # `<|endoftext|>` in the tokenizer; never sampled into prompts, rejected if generated
UNK_ID = 1   # `<unk>` in the tokenizer; never sampled into prompts

# The embedded English text the tokenizer is trained on (public-domain style prose, written here).
TOKENIZER_TEXT = """
The lighthouse stood at the end of the long stone pier, and every night the keeper climbed the
narrow stairs to light the lamp. He counted the ships that passed in the dark: fishing boats with
their small green lights, tall cargo ships that moved slowly along the horizon, and now and then a
ferry full of sleeping travellers. In the morning he wrote the numbers in a thick book with a blue
cover. The book was older than the keeper, and older than his father, who had kept the light before
him. On the first page someone had written the date in careful letters, and under it the words:
keep the light burning, count the ships, and write the truth.
The town behind the pier was small. There was a baker who opened his shop before the sun came up,
a school with one teacher and twenty children, a church with a bell that rang at noon, and a harbour
where the boats came home in the evening. When the weather was bad the whole town listened to the
wind, and the children asked the teacher whether the light would stay on. It always did.
One winter a storm came from the north. The rain fell for three days and the sea climbed over the
pier. The keeper did not sleep. He carried oil up the stairs, cleaned the glass, and watched the
water. On the third night he saw a small boat without lights, turning in the waves near the rocks.
He rang the bell, and the men of the town came down to the harbour with ropes and lanterns. They
brought the boat in, and the two young sailors in it were cold and frightened but alive.
In the spring the sailors came back with a gift: a new book for the numbers, with a red cover.
The keeper thanked them, but he kept writing in the old blue book until the last page was full.
"""
TEXT_PROMPT = "The keeper counted the ships that passed in the night, and wrote the numbers in the book."

# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------

BASE_CFG = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=16,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
    index_topk=8, index_n_heads=8, index_head_dim=16, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6}, max_position_embeddings=4096,
    tie_word_embeddings=False, bos_token_id=None, eos_token_id=[EOS_ID], pad_token_id=None,
)

CASES = [
    dict(name="sparse", seed0=1000, prompt_len=20, new_tokens=6, text=True,
         what="all layers 'full' indexer; prompt 20 > index_topk 8, so sparse attention is active "
              "from row 8 on; also carries tokenizer.json and a text prompt",
         cfg=dict()),
    dict(name="dense-equivalent", seed0=2000, prompt_len=20, new_tokens=6,
         what="index_topk 64 > T=26: every row keeps all causal keys, sparse == dense exactly; "
              "the indexer cannot change the output (negative control shows no effect)",
         cfg=dict(index_topk=64)),
    dict(name="shared-indexer", seed0=3000, prompt_len=20, new_tokens=6,
         what="GLM-5.2 style indexer_types [full, shared, full, shared]: shared layers have no "
              "indexer weights and reuse the previous full layer's top-k",
         cfg=dict(num_hidden_layers=4, indexer_types=["full", "shared", "full", "shared"])),
    dict(name="group-routing", seed0=4000, prompt_len=20, new_tokens=6, bias_mean=-0.6,
         require_fill_discrimination=True,
         what="group-limited routing: 8 experts in n_group=4 groups of 2, topk_group=2, top-2 "
              "experts; e_score_correction_bias has mean -0.6 so some selection scores are "
              "negative and the fill of dropped groups matters: transformers 5.17 fills them with "
              "-inf, a 0.0 fill would pick other experts at some tokens "
              "(checks.group_fill_zero_would_differ_tokens > 0 is required)",
         cfg=dict(n_group=4, topk_group=2, num_experts_per_tok=2)),
    dict(name="no-dense", seed0=5000, prompt_len=20, new_tokens=6,
         what="first_k_dense_replace=0: every layer is MoE (no dense MLP weights at all)",
         cfg=dict(first_k_dense_replace=0)),
    dict(name="one-token", seed0=6000, prompt_len=1, new_tokens=8,
         what="one-token prompt (prefill of length 1 must not be treated as decode) and 8 cached "
              "decode steps; index_topk 4 so the later decode steps are sparse",
         cfg=dict(index_topk=4)),
    dict(name="six-heads", seed0=7000, prompt_len=20, new_tokens=6,
         what="6 attention heads, vocab 264, moe_intermediate_size 24: every size tp-partition "
              "splits (heads, intermediate 96, MoE and shared-expert width 24, vocab) divides "
              "by 2, 3 and 6",
         cfg=dict(num_attention_heads=6, num_key_value_heads=6, vocab_size=264,
                  moe_intermediate_size=24)),
]


# ----------------------------------------------------------------------------------------------
# Method patching: rewrite HF's own method source with a few token replacements, so every
# variant we run (pure float64, NeoX negative control, score capture) is HF's code, not ours.
# ----------------------------------------------------------------------------------------------

CAPTURE: list = []  # filled by the capture patches: (kind, layer_idx or None, tensors...)


def _neox_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Half-split (NeoX / rotate_half) rope: the WRONG rope for GLM-5, for negative controls."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rewrite_method(cls, name, replacements):
    """Return cls.<name> recompiled from its source after exact string replacements.

    Every `old` must occur at least once (so an HF change cannot silently turn a patch into a
    no-op). The function is exec'd in the HF module's namespace plus our helpers."""
    src = textwrap.dedent(inspect.getsource(getattr(cls, name)))
    for old, new in replacements:
        assert old in src, f"patch anchor {old!r} not found in {cls.__name__}.{name}"
        src = src.replace(old, new)
    ns = dict(vars(hf))
    ns.update(_neox_rope=_neox_rope, CAPTURE=CAPTURE)
    exec(compile(src, f"<patched {cls.__name__}.{name}>", "exec"), ns)
    return ns[name]


@contextlib.contextmanager
def patched(patches):
    """patches: list of (cls, method_name, function). Restores the originals on exit."""
    saved = [(cls, name, cls.__dict__[name]) for cls, name, _ in patches]
    try:
        for cls, name, fn in patches:
            setattr(cls, name, fn)
        yield
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)


def pure64_patches():
    """HF casts to float32 in RMSNorm, the rotary tables, the router and the indexer even in a
    float64 model. Turn those casts into float64; nothing else changes."""
    f32 = [("torch.float32", "torch.float64"), (".float()", ".double()"),
           ("dtype=torch.float,", "dtype=torch.float64,")]
    out = []
    for cls, name, reps in [
        (hf.GlmMoeDsaRMSNorm, "forward", [f32[0]]),
        (hf.GlmMoeDsaRotaryEmbedding, "forward", [f32[1], f32[2]]),
        (hf.GlmMoeDsaTopkRouter, "forward", [f32[0]]),
        (hf.GlmMoeDsaIndexer, "forward", [f32[1]]),
    ]:
        out.append((cls, name, rewrite_method(cls, name, reps)))
    return out


def capture_patches(pure64):
    """Record the exact tensors HF runs topk on: indexer scores (after the causal mask) and the
    router's group scores and final selection scores."""
    idx_reps = [("    topk = min(self.index_topk",
                 "    CAPTURE.append(('indexer', self.layer_idx, index_scores.detach().clone()))\n"
                 "    topk = min(self.index_topk")]
    rt_reps = [("    group_idx = torch.topk(group_scores",
                "    CAPTURE.append(('group', None, group_scores.detach().clone(),"
                " scores_for_choice.detach().clone()))\n"
                "    group_idx = torch.topk(group_scores"),
               ("    topk_indices = torch.topk(scores_for_choice",
                "    CAPTURE.append(('router', None, scores_for_choice.detach().clone()))\n"
                "    topk_indices = torch.topk(scores_for_choice")]
    if pure64:
        idx_reps.append((".float()", ".double()"))
        rt_reps.append(("torch.float32", "torch.float64"))
    return [(hf.GlmMoeDsaIndexer, "forward", rewrite_method(hf.GlmMoeDsaIndexer, "forward", idx_reps)),
            (hf.GlmMoeDsaTopkRouter, "forward", rewrite_method(hf.GlmMoeDsaTopkRouter, "forward", rt_reps))]


def neox_indexer_patch(pure64):
    reps = [("apply_rotary_pos_emb_interleave(", "_neox_rope(")]
    if pure64:
        reps.append((".float()", ".double()"))
    return [(hf.GlmMoeDsaIndexer, "forward", rewrite_method(hf.GlmMoeDsaIndexer, "forward", reps))]


def neox_mla_patch():
    reps = [("apply_rotary_pos_emb_interleave(", "_neox_rope(")]
    return [(hf.GlmMoeDsaAttention, "forward", rewrite_method(hf.GlmMoeDsaAttention, "forward", reps))]


def dense_indexer_patch():
    """Indexer keeps every key (top-k width = #keys): what an implementation that ignores DSA gets."""
    reps = [("topk = min(self.index_topk, index_scores.shape[-1])", "topk = index_scores.shape[-1]")]
    return [(hf.GlmMoeDsaIndexer, "forward", rewrite_method(hf.GlmMoeDsaIndexer, "forward", reps))]


def zero_fill_router_patch():
    """Router that fills dropped groups with 0.0 instead of -inf (the other convention in the wild)."""
    reps = [('masked_fill(~score_mask.bool(), float("-inf"))', 'masked_fill(~score_mask.bool(), 0.0)')]
    return [(hf.GlmMoeDsaTopkRouter, "forward", rewrite_method(hf.GlmMoeDsaTopkRouter, "forward", reps))]


# ----------------------------------------------------------------------------------------------
# Model construction
# ----------------------------------------------------------------------------------------------

def make_config(case):
    kw = dict(BASE_CFG)
    kw.update(case["cfg"])
    cfg = GlmMoeDsaConfig(**kw)
    cfg._experts_implementation = "eager"  # grouped_mm rejects float64
    cfg._attn_implementation = "sdpa"
    return cfg


def randomise(model, gen, bias_mean=0.0):
    """Give EVERY parameter and persistent buffer a random value, then round it to float32.

    Scales: linear weights N(0, 1/fan_in) (fan_in = last dim, also for the fused 3-D expert
    tensors), embeddings N(0,1), lm_head x2 (logits |.| <~ 10), router x2 (spread the sigmoid), norm
    weights U(0.5,1.5) (init is 1), k_norm bias N(0,0.5) (init 0), e_score_correction_bias
    N(bias_mean, 0.3) (init 0). The float32 rounding makes the float64 logits come from exactly
    the weights saved in float32."""
    in_state_dict = set(model.state_dict().keys())  # excludes non-persistent rope buffers
    tensors = dict(model.named_parameters())
    tensors.update({n: b for n, b in model.named_buffers() if n in in_state_dict})
    assert set(tensors) == in_state_dict, set(tensors) ^ in_state_dict
    for name, t in sorted(tensors.items()):
        shape = t.shape
        if name.endswith("norm.weight"):                   # RMSNorms and indexer k_norm (LayerNorm)
            v = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5
        elif name.endswith("k_norm.bias"):
            v = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5
        elif name.endswith("e_score_correction_bias"):
            v = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3 + bias_mean
        elif name.endswith("embed_tokens.weight"):
            v = torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            assert t.dim() >= 2, f"unhandled 1-D tensor {name}"
            gain = 2.0 if name == "lm_head.weight" or name.endswith("mlp.gate.weight") else 1.0
            v = torch.randn(shape, generator=gen, dtype=torch.float64) * (gain / math.sqrt(shape[-1]))
        with torch.no_grad():
            t.copy_(v.float().to(t.dtype))  # round to float32 first
    return sorted(tensors)


def build_model(case, seed):
    cfg = make_config(case)
    torch.manual_seed(seed)
    model = GlmMoeDsaForCausalLM(cfg).to(torch.float64).eval()
    gen = torch.Generator().manual_seed(seed)
    randomise(model, gen, case.get("bias_mean", 0.0))
    # Prompt ids avoid EOS and UNK.
    prompt = torch.randint(2, VOCAB, (case["prompt_len"],), generator=gen)
    return model, prompt


def set_rope_pure64(model, enable):
    """Stock HF computes inv_freq in float32 at init; for the pure64 path recompute it in f64."""
    rot = model.model.rotary_emb
    if not hasattr(rot, "_stock_inv_freq"):
        rot._stock_inv_freq = rot.inv_freq.clone()
    if enable:
        dim = model.config.head_dim
        base = model.config.rope_parameters["rope_theta"]
        rot.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    else:
        rot.inv_freq = rot._stock_inv_freq.clone()


@contextlib.contextmanager
def mode(model, pure64, extra=()):
    """Run `model` in the stock or pure-float64 variant, with optional extra method patches."""
    patches = pure64_patches() if pure64 else []
    for p in extra:
        patches = [q for q in patches if not (q[0] is p[0] and q[1] == p[1])] + [p]
    set_rope_pure64(model, pure64)
    try:
        with patched(patches):
            yield
    finally:
        set_rope_pure64(model, False)


# ----------------------------------------------------------------------------------------------
# Forward passes and checks
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def full_logits(model, tokens):
    out = model(input_ids=tokens[None], use_cache=False)
    return out.logits[0].to(torch.float64)


@torch.no_grad()
def greedy_generate(model, prompt, n):
    """HF `generate` (greedy). Only the ids are used: generate returns its logits in float32."""
    out = model.generate(
        input_ids=prompt[None], attention_mask=torch.ones_like(prompt)[None],
        max_new_tokens=n, do_sample=False, num_beams=1, use_cache=True,
        eos_token_id=EOS_ID, pad_token_id=EOS_ID,
    )
    return out[0, prompt.shape[0]:]


@torch.no_grad()
def greedy_cached(model, prompt, n):
    """HF's own cached decode, driven step by step so the logits stay float64: a prefill over the
    prompt, then n-1 single-token forwards with the same DynamicCache (positions come from the
    cache length, as in generate). Returns (generated ids [n], logits [n, V])."""
    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt[None], past_key_values=cache, use_cache=True)
    rows = [out.logits[0, -1].to(torch.float64)]
    ids = [rows[-1].argmax()]
    for _ in range(n - 1):
        out = model(input_ids=ids[-1].view(1, 1), past_key_values=cache, use_cache=True)
        rows.append(out.logits[0, -1].to(torch.float64))
        ids.append(rows[-1].argmax())
    return torch.stack(ids), torch.stack(rows)


def rel_gap(sorted_desc, k):
    """(v_k - v_{k+1}) / max|v| for a descending row; inf when there is no (k+1)-th candidate."""
    finite = sorted_desc[torch.isfinite(sorted_desc)]
    if k >= finite.numel():
        return math.inf
    scale = finite.abs().max().item()
    return (finite[k - 1] - finite[k]).item() / max(scale, 1e-300)


def topk_gaps(model, tokens, pure64):
    """Run one full forward with score capture; return min relative gaps and details."""
    cfg = model.config
    CAPTURE.clear()
    with mode(model, pure64, extra=capture_patches(pure64)):
        full_logits(model, tokens)
    T = tokens.shape[0]
    res = dict(indexer_min_gap=math.inf, indexer_rows_checked=0, router_min_gap=math.inf,
               router_rows_checked=0, group_min_gap=math.inf, group_rows_checked=0,
               group_fill_zero_would_differ_tokens=0, indexer_zero_scores_frac=None)
    zeros, total = 0, 0
    for item in CAPTURE:
        kind = item[0]
        if kind == "indexer":
            scores = item[2][0]  # [S, T] with the additive causal mask already applied
            K = cfg.index_topk
            for s in range(T):
                row = scores[s, : s + 1]          # causal keys only
                zeros += int((row == 0).sum()); total += row.numel()
                if s + 1 <= K:
                    continue                      # every causal key is kept: nothing to tie
                g = rel_gap(row.sort(descending=True).values, K)
                res["indexer_min_gap"] = min(res["indexer_min_gap"], g)
                res["indexer_rows_checked"] += 1
        elif kind == "router":
            choice = item[2]                      # [tokens, E], dropped groups already -inf
            for r in range(choice.shape[0]):
                g = rel_gap(choice[r].sort(descending=True).values, cfg.num_experts_per_tok)
                res["router_min_gap"] = min(res["router_min_gap"], g)
                res["router_rows_checked"] += 1
        elif kind == "group":
            gs, sfc = item[2], item[3]
            for r in range(gs.shape[0]):
                if cfg.n_group > 1:
                    g = rel_gap(gs[r].sort(descending=True).values, cfg.topk_group)
                    res["group_min_gap"] = min(res["group_min_gap"], g)
                    res["group_rows_checked"] += 1
                    # Would the other convention (dropped groups filled with 0.0, not -inf) pick
                    # a different expert set here? (0.0 ties make that rule ill-defined anyway.)
                    keep = torch.zeros(cfg.n_group, dtype=torch.bool)
                    keep[gs[r].topk(cfg.topk_group).indices] = True
                    keep = keep.repeat_interleave(cfg.n_routed_experts // cfg.n_group)
                    a = set(sfc[r].masked_fill(~keep, float("-inf")).topk(cfg.num_experts_per_tok).indices.tolist())
                    b = set(sfc[r].masked_fill(~keep, 0.0).topk(cfg.num_experts_per_tok).indices.tolist())
                    res["group_fill_zero_would_differ_tokens"] += int(a != b)
    res["indexer_zero_scores_frac"] = zeros / total if total else None
    return res


def argmax_gaps(logits, rows):
    gaps = []
    for r in rows:
        gaps.append(rel_gap(logits[r].sort(descending=True).values, 1))
    return min(gaps) if gaps else math.inf


def evaluate(model, prompt, n_new):
    """Generate greedily from `prompt` and run every check on the resulting sequence.

    Returns (tokens, generated, logits_stock, logits_pure64, numbers, failures). Fails fast: the
    cheap checks run first and the first failing stage ends the evaluation (the seed is dropped)."""
    P = prompt.shape[0]
    d = dict(P=P, N=n_new, T=P + n_new)
    with mode(model, pure64=False):
        gen = greedy_generate(model, prompt, n_new)
    tokens = torch.cat([prompt, gen])
    T = tokens.shape[0]
    if gen.shape[0] != n_new or (gen == EOS_ID).any():
        return tokens, gen, None, None, d, ["generation hit EOS / stopped early"]

    # (b) tie gaps of every top-k, measured on the exact tensors HF's topk runs on.
    fails = []
    for pure64 in (False, True):
        g = topk_gaps(model, tokens, pure64)
        tag = "pure64" if pure64 else "stock"
        for key in ("indexer_min_gap", "router_min_gap", "group_min_gap"):
            if g[key] < GAP_REL:
                fails.append(f"{tag} {key} {g[key]:.3g}")
        if not pure64:
            d.update(g)
        else:
            d.update({k + "_pure64": v for k, v in g.items() if k.endswith("min_gap")})
    if fails:
        return tokens, gen, None, None, d, fails

    # (c) clear greedy choices.
    with mode(model, pure64=False):
        logits_stock = full_logits(model, tokens)
    rows = list(range(P - 1, T - 1))  # row i = logits after token i; these rows chose gen
    d["argmax_min_gap"] = argmax_gaps(logits_stock, rows)
    if not torch.equal(logits_stock[rows].argmax(-1), gen):
        fails.append("full-forward argmax disagrees with generated tokens")
    if d["argmax_min_gap"] < GAP_REL:
        fails.append(f"argmax gap {d['argmax_min_gap']:.3g}")
    if fails:
        return tokens, gen, None, None, d, fails

    # (a) cached decode (HF's DynamicCache path) vs one full forward, stock and pure float64.
    with mode(model, pure64=False):
        gen_s, dec_stock = greedy_cached(model, prompt, n_new)
    with mode(model, pure64=True):
        gen_p, dec_pure = greedy_cached(model, prompt, n_new)
        logits_pure = full_logits(model, tokens)
    if not (torch.equal(gen, gen_s) and torch.equal(gen, gen_p)):
        return tokens, gen, None, None, d, ["generate / stock cached / pure64 cached continuations differ"]
    d["decode_vs_full_stock"] = (dec_stock - logits_stock[rows]).abs().max().item()
    d["decode_vs_full_pure64"] = (dec_pure - logits_pure[rows]).abs().max().item()
    d["stock_vs_pure64"] = (logits_stock - logits_pure).abs().max().item()
    d["logits_absmax"] = logits_stock.abs().max().item()
    d["logits_std"] = logits_stock.std().item()
    if d["decode_vs_full_pure64"] > DECODE_TOL_PURE64:
        fails.append(f"pure64 decode vs full {d['decode_vs_full_pure64']:.3g}")
    if d["decode_vs_full_stock"] > DECODE_TOL_STOCK:
        fails.append(f"stock decode vs full {d['decode_vs_full_stock']:.3g}")

    # (d) negative controls (stock path; their effect is O(1) or exactly 0).
    with mode(model, pure64=False, extra=neox_indexer_patch(False)):
        d["neg_neox_indexer_rope_max_diff"] = (full_logits(model, tokens) - logits_stock).abs().max().item()
    with mode(model, pure64=False, extra=neox_mla_patch()):
        d["neg_neox_mla_rope_max_diff"] = (full_logits(model, tokens) - logits_stock).abs().max().item()
    with mode(model, pure64=False, extra=dense_indexer_patch()):
        d["dense_attention_max_diff"] = (full_logits(model, tokens) - logits_stock).abs().max().item()
    if model.config.n_group > 1:
        with mode(model, pure64=False, extra=zero_fill_router_patch()):
            d["neg_group_fill_zero_max_diff"] = (full_logits(model, tokens) - logits_stock).abs().max().item()
    d["sparse_rows"] = max(0, T - model.config.index_topk)
    if d["sparse_rows"] > 0:
        if d["neg_neox_indexer_rope_max_diff"] < NEG_MIN_EFFECT:
            fails.append(f"indexer-rope negative control too weak {d['neg_neox_indexer_rope_max_diff']:.3g}")
    elif d["neg_neox_indexer_rope_max_diff"] > NEG_DENSE_TOL or d["dense_attention_max_diff"] > NEG_DENSE_TOL:
        fails.append("dense-equivalent case is sensitive to the indexer")
    if d["neg_neox_mla_rope_max_diff"] < NEG_MIN_EFFECT:
        fails.append("MLA-rope negative control too weak")
    return tokens, gen, logits_stock, logits_pure, d, fails


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------

def train_tokenizer(vocab_size):
    """A tiny BPE over characters with Metaspace pre-tokenization (reversible, no byte tricks).

    Special tokens: `<|endoftext|>` = 0 (the models' eos_token_id) and `<unk>` = 1. No
    post-processor: encoding adds no BOS/EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<unk>"],
                                  show_progress=False)
    lines = [l for l in TOKENIZER_TEXT.strip().split("\n")]
    tok.train_from_iterator(lines, trainer=trainer)
    assert tok.token_to_id("<|endoftext|>") == EOS_ID and tok.token_to_id("<unk>") == UNK_ID
    assert tok.get_vocab_size() <= VOCAB
    return tok


# ----------------------------------------------------------------------------------------------
# Writing a case
# ----------------------------------------------------------------------------------------------

def jsonable(x):
    """inf (a top-k with nothing to tie, e.g. no row past index_topk) -> null: strict JSON."""
    if isinstance(x, float) and math.isinf(x):
        return None
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def save_case(case, seed, model, prompt, tokens, gen, logits, logits_pure, d, outdir, text=None):
    cdir = os.path.join(outdir, case["name"])
    if os.path.exists(cdir):
        shutil.rmtree(cdir)
    os.makedirs(cdir)
    # Weights in float32. The values are float32-exact already, so this loses nothing.
    model32 = model.to(torch.float32)
    model32.save_pretrained(cdir, safe_serialization=True)
    model.to(torch.float64)
    keep = {"config.json", "generation_config.json", "model.safetensors"}
    removed = []
    for f in sorted(os.listdir(cdir)):
        if f not in keep:
            removed.append(f)
            p = os.path.join(cdir, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    assert os.path.exists(os.path.join(cdir, "config.json"))
    assert os.path.exists(os.path.join(cdir, "model.safetensors"))

    # Reload what was written, in float64, and recompute: the files must reproduce the oracle.
    reloaded = GlmMoeDsaForCausalLM.from_pretrained(cdir, dtype=torch.float64, experts_implementation="eager",
                                              attn_implementation="sdpa").eval()
    reload_dtypes = sorted({f"{n}:{str(t.dtype)}" for n, t in list(reloaded.named_parameters()) + list(reloaded.named_buffers())
                            if t.dtype != torch.float64 and "inv_freq" not in n})
    with mode(reloaded, pure64=False):
        rl = full_logits(reloaded, tokens)
    with mode(reloaded, pure64=True):
        rlp = full_logits(reloaded, tokens)
    d["reload_max_diff_stock"] = (rl - logits).abs().max().item()
    d["reload_max_diff_pure64"] = (rlp - logits_pure).abs().max().item()
    assert d["reload_max_diff_stock"] < 1e-9 and d["reload_max_diff_pure64"] < 1e-12, d
    d["reload_non_float64_tensors"] = reload_dtypes

    with safe_open(os.path.join(cdir, "model.safetensors"), "pt") as f:
        weight_keys = {k: [str(f.get_slice(k).get_dtype()), list(f.get_slice(k).get_shape())] for k in f.keys()}
    with open(os.path.join(cdir, "config.json")) as f:
        saved_cfg = json.load(f)

    tensors = {
        "tokens": tokens.to(torch.int64).contiguous(),
        "prompt": prompt.to(torch.int64).contiguous(),
        "generated": gen.to(torch.int64).contiguous(),
        "logits": logits.to(torch.float64).contiguous(),
        "logits_pure64": logits_pure.to(torch.float64).contiguous(),
    }
    checks = dict(
        case=case["name"], what=case["what"], seed=seed, gap_rel_threshold=GAP_REL,
        config_overrides=case["cfg"], attn_implementation=model.config._attn_implementation,
        experts_implementation="eager", files_removed_after_save_pretrained=removed,
        indexer_types=saved_cfg.get("indexer_types"), mlp_layer_types=saved_cfg.get("mlp_layer_types"),
        checks=d, versions=VERSIONS, date=RUN_DATE,
    )
    if text is not None:
        tensors["text_prompt"] = text["prompt_ids"].to(torch.int64).contiguous()
        tensors["text_generated"] = text["generated_ids"].to(torch.int64).contiguous()
        tensors["text_tokens"] = text["tokens"].to(torch.int64).contiguous()
        tensors["text_logits"] = text["logits"].to(torch.float64).contiguous()
        tensors["text_logits_pure64"] = text["logits_pure"].to(torch.float64).contiguous()
        text["tokenizer"].save(os.path.join(cdir, "tokenizer.json"))
        # The saved file must encode the text prompt to the same ids.
        again = tokenizers.Tokenizer.from_file(os.path.join(cdir, "tokenizer.json")).encode(TEXT_PROMPT).ids
        assert again == text["prompt_ids"].tolist(), (again, text["prompt_ids"])
        checks["text"] = dict(prompt=TEXT_PROMPT, prompt_ids=text["prompt_ids"].tolist(),
                              generated_ids=text["generated_ids"].tolist(),
                              generated_text=text["generated_text"],
                              tokenizer_vocab_size=text["tokenizer"].get_vocab_size(),
                              checks=text["d"])
    checks["model_safetensors"] = weight_keys
    checks = jsonable(checks)
    meta = {"case": case["name"], "seed": str(seed), "checks": json.dumps(checks["checks"], sort_keys=True),
            "versions": json.dumps(VERSIONS, sort_keys=True), "date": RUN_DATE,
            "gap_rel_threshold": str(GAP_REL)}
    if text is not None:
        meta["text_prompt"] = TEXT_PROMPT
        meta["text"] = json.dumps({k: v for k, v in checks["text"].items() if k != "checks"}, sort_keys=True)
        meta["text_checks"] = json.dumps(checks["text"]["checks"], sort_keys=True)
    save_file(tensors, os.path.join(cdir, "oracle.safetensors"), metadata=meta)
    with open(os.path.join(cdir, "checks.json"), "w") as f:
        json.dump(checks, f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")
    return checks


def run_case(case, outdir, tok):
    reasons = collections.Counter()
    for attempt in range(MAX_SEED_TRIES):
        seed = case["seed0"] + attempt
        model, prompt = build_model(case, seed)
        tokens, gen, logits, logits_pure, d, fails = evaluate(model, prompt, case["new_tokens"])
        if not fails and case.get("require_fill_discrimination") and (
                d["group_fill_zero_would_differ_tokens"] == 0 or d["neg_group_fill_zero_max_diff"] < NEG_MIN_EFFECT):
            fails.append("group fill: 0.0 and -inf fills agree")
        text = None
        if not fails and case.get("text"):
            ids = torch.tensor(tok.encode(TEXT_PROMPT).ids, dtype=torch.int64)
            assert (ids != UNK_ID).all() and ids.numel() > model.config.index_topk
            ttokens, tgen, tl, tlp, td, tfails = evaluate(model, ids, case["new_tokens"])
            fails += ["text: " + f for f in tfails]
            text = dict(prompt_ids=ids, generated_ids=tgen, d=td, tokenizer=tok, tokens=ttokens,
                        logits=tl, logits_pure=tlp,
                        generated_text=tok.decode(tgen.tolist()))
        if fails:
            for f in fails:
                reasons[f.split(" ")[0] + " " + f.split(" ")[1]] += 1
            continue
        print(f"  [{case['name']}] seed {seed} accepted after {attempt + 1} tries;"
              f" rejections by first words of reason: {dict(reasons)}")
        return save_case(case, seed, model, prompt, tokens, gen, logits, logits_pure, d, outdir, text)
    raise SystemExit(f"no seed passed all checks for case {case['name']}")


# ----------------------------------------------------------------------------------------------

def check_hf_rope_fix():
    """GLM5-SPEC §5.1: the MLA and the indexer must both call the interleaved rope."""
    path = hf.__file__
    out = subprocess.run(["grep", "-n", "apply_rotary_pos_emb_interleave", path],
                         capture_output=True, text=True).stdout
    print(f"grep -n apply_rotary_pos_emb_interleave {path}\n{out}", end="")
    calls = [l for l in out.splitlines() if "def apply_rotary_pos_emb_interleave" not in l]
    assert len(calls) == 2, f"expected 2 call sites of apply_rotary_pos_emb_interleave, got {calls}"
    return [l.split(":", 1)[0] for l in calls]


def fmt(x):
    return "n/a" if x is None or x == math.inf else f"{x:.3g}"


def main():
    global VERSIONS, RUN_DATE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
    ap.add_argument("--date", default=datetime.date.today().isoformat(),
                    help="date recorded in the fixtures' metadata")
    ap.add_argument("--only", nargs="*", help="case names to (re)make; default all")
    args = ap.parse_args()

    torch.set_num_threads(1)  # tiny models; one thread makes float64 reductions reproducible
    RUN_DATE = args.date
    VERSIONS = dict(transformers=transformers.__version__, torch=torch.__version__,
                    tokenizers=tokenizers.__version__, safetensors=safetensors.__version__,
                    python=platform.python_version())
    print("versions:", json.dumps(VERSIONS), "python3:", sys.executable)
    VERSIONS["rope_call_sites"] = check_hf_rope_fix()

    tok = train_tokenizer(VOCAB)
    print(f"tokenizer: vocab {tok.get_vocab_size()}, text prompt -> {len(tok.encode(TEXT_PROMPT).ids)} ids")

    os.makedirs(args.out, exist_ok=True)
    results = []
    for case in CASES:
        if args.only and case["name"] not in args.only:
            continue
        print(f"case {case['name']}: {case['what']}")
        results.append(run_case(case, args.out, tok))

    # Summary table for README.md
    print("\n| case | seed | T (P+N) | indexer min gap (rows) | router min gap (rows) | group min gap |"
          " argmax min gap | decode vs full (stock / pure64) | stock vs pure64 | reload diff |"
          " neg: NeoX indexer rope | neg: NeoX MLA rope | dense attention | max abs logit |")
    print("|" + "---|" * 14)
    for c in results:
        d = c["checks"]
        print(f"| {c['case']} | {c['seed']} | {d['T']} ({d['P']}+{d['N']}) |"
              f" {fmt(d['indexer_min_gap'])} ({d['indexer_rows_checked']}) |"
              f" {fmt(d['router_min_gap'])} ({d['router_rows_checked']}) | {fmt(d['group_min_gap'])} |"
              f" {fmt(d['argmax_min_gap'])} | {fmt(d['decode_vs_full_stock'])} / {fmt(d['decode_vs_full_pure64'])} |"
              f" {fmt(d['stock_vs_pure64'])} | {fmt(d['reload_max_diff_stock'])} |"
              f" {fmt(d['neg_neox_indexer_rope_max_diff'])} | {fmt(d['neg_neox_mla_rope_max_diff'])} |"
              f" {fmt(d['dense_attention_max_diff'])} | {fmt(d['logits_absmax'])} |")
        if "text" in c:
            t = c["text"]["checks"]
            print(f"| {c['case']} (text) | {c['seed']} | {t['T']} ({t['P']}+{t['N']}) |"
                  f" {fmt(t['indexer_min_gap'])} ({t['indexer_rows_checked']}) |"
                  f" {fmt(t['router_min_gap'])} ({t['router_rows_checked']}) | {fmt(t['group_min_gap'])} |"
                  f" {fmt(t['argmax_min_gap'])} | {fmt(t['decode_vs_full_stock'])} / {fmt(t['decode_vs_full_pure64'])} |"
                  f" {fmt(t['stock_vs_pure64'])} | - |"
                  f" {fmt(t['neg_neox_indexer_rope_max_diff'])} | {fmt(t['neg_neox_mla_rope_max_diff'])} |"
                  f" {fmt(t['dense_attention_max_diff'])} | {fmt(t['logits_absmax'])} |")
    for c in results:
        extra = {k: c["checks"][k] for k in ("group_fill_zero_would_differ_tokens", "neg_group_fill_zero_max_diff",
                                             "indexer_zero_scores_frac", "reload_non_float64_tensors",
                                             "sparse_rows") if k in c["checks"]}
        print(f"{c['case']}: {json.dumps(extra)}")
    print("done")


VERSIONS: dict = {}
RUN_DATE = ""

if __name__ == "__main__":
    main()
