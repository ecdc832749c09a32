#!/usr/bin/env python3
"""transformers' GlmMoeDsaForCausalLM on the GPU, as the peer of `glmc bench`.

Usage:
  hf_glm5.py --model models/glm5-slice.ron --modes eager,max-autotune-no-cudagraphs,reduce-overhead \
      --batch 1,8 --context 1024,8192 --out hf.json [--timeout 240] [--seed 1]
  hf_glm5.py --tiny ...      a tiny config of the same family (seconds, on any device torch has)
  hf_glm5.py --dry-run ...   print the config and the plan; imports neither torch nor transformers

The model is built from glmc's model.ron (its dimensions, bf16) with random weights of the
distribution glmc's `--random-weights` uses: a matrix uniform with std 1/sqrt(fan_in), a norm
weight 1 +- 0.05, a bias +- 0.01 (not the same values: a different generator). A context is
stated as glmc states it: the caches are filled with random rows, no prefill; each sequence of
a batch has its own rows and its own random token. Both caches of a layer are filled: the
attention's K/V and the DSA indexer's keys (transformers' `update_indexer`). Every timed step
decodes the token at position context-1, attending over context-1 cached rows plus its own
(checked before and after timing: a wrong fill fails the mode instead of timing other work);
then the caches are cut back outside the timed region, so each step does the same work.

Modes: `eager` (no torch.compile), and torch.compile with `max-autotune-no-cudagraphs` over a
DynamicCache, or `reduce-overhead` (CUDA graphs) over a StaticCache. Each mode runs in its own
process under --timeout seconds; its compile time (the first call's time minus a step's) is
recorded per point, and a failure or timeout is recorded with its message, never hidden. The
JSON (schema glmc-bench-peer/1) is rewritten after every point, so a timeout keeps what was done.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import traceback

SCHEMA = "glmc-bench-peer/1"
MODES = ("eager", "max-autotune-no-cudagraphs", "reduce-overhead")


def read_ron(path):
    """The scalar fields of a glmc model.ron, flattened (the nested names do not collide)."""
    text = open(path).read()
    out = {}
    for key, value in re.findall(r"^\s*(\w+):\s*([^,\n\[\(]+?)\s*,?\s*$", text, re.M):
        v = value.strip().strip('"')
        if v in ("true", "false"):
            out[key] = v == "true"
        else:
            try:
                out[key] = int(v)
            except ValueError:
                try:
                    out[key] = float(v)
                except ValueError:
                    out[key] = v
    return out


def hf_config_kwargs(ron):
    """GlmMoeDsaConfig's keyword arguments for a glmc model.ron."""
    layers = ron["num_hidden_layers"]
    return dict(
        vocab_size=ron["vocab_size"],
        hidden_size=ron["hidden_size"],
        intermediate_size=ron["intermediate_size"],
        moe_intermediate_size=ron["moe_intermediate_size"],
        num_hidden_layers=layers,
        num_attention_heads=ron["num_attention_heads"],
        num_key_value_heads=ron["num_attention_heads"],
        n_shared_experts=ron["n_shared_experts"],
        n_routed_experts=ron["n_routed_experts"],
        routed_scaling_factor=ron["routed_scaling_factor"],
        kv_lora_rank=ron["kv_lora_rank"],
        q_lora_rank=ron["q_lora_rank"],
        qk_rope_head_dim=ron["qk_rope_head_dim"],
        v_head_dim=ron["v_head_dim"],
        qk_nope_head_dim=ron["qk_nope_head_dim"],
        n_group=ron["n_group"],
        topk_group=ron["topk_group"],
        num_experts_per_tok=ron["num_experts_per_tok"],
        norm_topk_prob=ron["norm_topk_prob"],
        max_position_embeddings=ron["max_position_embeddings"],
        rms_norm_eps=ron["rms_norm_eps"],
        tie_word_embeddings=ron["tie_word_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": ron["rope_theta"]},
        index_topk=ron["index_topk"],
        index_head_dim=ron["index_head_dim"],
        index_n_heads=ron["index_n_heads"],
        first_k_dense_replace=ron["first_k_dense_replace"],
        indexer_types=["full"] * layers,
    )


def tiny_kwargs():
    """A GLM-5-shaped model small enough for a CPU, for checking this script."""
    return dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1,
        n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=8, n_group=1, topk_group=1,
        num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}, index_topk=8,
        index_head_dim=16, index_n_heads=2, first_k_dense_replace=1, indexer_types=["full"] * 2,
    )


def ints(text):
    return [int(x) for x in text.split(",") if x]


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def stats(xs):
    v = sorted(xs)
    n = len(v)
    median = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return {"median": median, "min": v[0], "mean": sum(v) / n, "max": v[-1]}


def randomise(model, torch, generator):
    """glmc's distribution (runtime/src/random_weights.rs), with torch's generator."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                a = math.sqrt(3.0 / p.shape[-1])
                p.uniform_(-a, a, generator=generator)
            elif name.endswith("bias"):
                p.uniform_(-0.01, 0.01, generator=generator)
            else:
                p.uniform_(0.95, 1.05, generator=generator)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.uniform_(-0.01, 0.01, generator=generator)


class Caches:
    """Random cache rows for `batch` sequences at `context` (context-1 rows cached), and the
    way back to that state after each step.

    transformers 5.x keeps two caches per layer in the Cache object: the expanded per-head K/V
    (`update`) and the DSA indexer's keys (`update_indexer`, [batch, rows, index_head_dim]). Both
    are filled here with `context` random rows and then cut back to context-1 by `reset`, the
    same way as after every step, so the first step already sees the tensors (and strides) that
    every later step sees. A DynamicCache is cut back with `crop`; a StaticCache (CUDA graphs:
    fixed shapes and addresses, `context` rows long) writes each step at its fill counters,
    which `reset` sets back in place, so every step rewrites row context-1."""

    def __init__(self, torch, transformers, model, config, mode, batch, context, device, generator):
        self.torch, self.context, self.cached = torch, context, context - 1
        self.layers = config.num_hidden_layers
        heads = config.num_attention_heads
        kdim = config.qk_nope_head_dim + config.qk_rope_head_dim
        dtype = torch.bfloat16 if device != "cpu" else torch.float32
        rows = lambda *shape: torch.randn(*shape, device=device, dtype=dtype, generator=generator)
        if mode == "reduce-overhead":
            self.cache = transformers.StaticCache(config=config, max_cache_len=context)
        else:
            self.cache = transformers.DynamicCache(config=config)
        self.static = isinstance(self.cache, transformers.StaticCache)
        if len(self.cache.layers) != self.layers or not all(hasattr(l, "update_indexer") for l in self.cache.layers):
            raise RuntimeError(
                f"{type(self.cache).__name__}(config) has no indexer key cache per layer "
                f"({[type(l).__name__ for l in self.cache.layers]}): this script needs transformers' "
                "DynamicIndexedLayer / StaticIndexedLayer (transformers >= 5.17)")
        for layer in range(self.layers):
            k, v = rows(batch, heads, context, kdim), rows(batch, heads, context, config.v_head_dim)
            self.cache.update(k, v, layer)
            self.cache.update_indexer(rows(batch, context, config.index_head_dim), layer)
        self.check(context, "after the fill")
        self.reset()
        self.check(self.cached, "after the first reset")

    def lengths(self):
        """(K/V rows, indexer key rows) each layer holds; a step attends over these."""
        out = []
        for i, layer in enumerate(self.cache.layers):
            kv = int(self.cache.get_seq_length(i))
            if self.static:
                index = int(layer.indexer_cumulative_length)
            else:
                index = layer.indexer_keys.shape[1] if layer.indexer_keys is not None else 0
            out.append((kv, index))
        return out

    def check(self, rows, when):
        """Fails loudly unless every layer's K/V and indexer caches hold `rows` rows (and, for a
        StaticCache, are `context` rows long, so the step's mask covers exactly those)."""
        got = self.lengths()
        if got != [(rows, rows)] * self.layers:
            raise AssertionError(f"{when}: the caches hold (K/V rows, indexer rows) {got} per layer, "
                                 f"not {rows} each (context {self.context})")
        if self.static:
            sizes = [(l.keys.shape[2], l.indexer_keys.shape[1]) for l in self.cache.layers]
            if sizes != [(self.context, self.context)] * self.layers:
                raise AssertionError(f"{when}: static caches of {sizes} rows, not {self.context}")

    def reset(self):
        """Back to context-1 cached rows in both caches of every layer."""
        if self.static:
            for layer in self.cache.layers:
                # In place: CUDA graphs read these counters at fixed addresses.
                layer.cumulative_length.fill_(self.cached)
                layer.indexer_cumulative_length.fill_(self.cached)
        else:
            extra = int(self.cache.get_seq_length()) - self.cached
            if extra > 0:
                self.cache.crop(-extra)  # a negative count: the rows to remove, K/V and indexer keys


def run_mode(args):
    """One mode in this process: builds the model, times every point, rewrites args.out."""
    import torch
    import transformers
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    kwargs = tiny_kwargs() if args.tiny else hf_config_kwargs(read_ron(args.model))
    config = GlmMoeDsaConfig(**kwargs)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    record = {
        "mode": args.mode,
        "status": "running",
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "decode": [],
    }

    def save():
        json.dump(record, open(args.out, "w"), indent=1)

    save()
    start = time.time()
    torch.set_default_dtype(torch.bfloat16 if device == "cuda" else torch.float32)
    with torch.device(device):
        model = GlmMoeDsaForCausalLM(config)
    model.eval()
    randomise(model, torch, generator)
    record["build_s"] = time.time() - start
    record["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    record["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    forward = model
    if args.mode != "eager":
        forward = torch.compile(model, mode=args.mode)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for context in args.context:
        for batch in args.batch:
            point = {"batch": batch, "context": context}
            record["decode"].append(point)
            caches = Caches(torch, transformers, model, config, args.mode, batch, context, device, generator)
            ids = torch.randint(0, config.vocab_size, (batch, 1), device=device, generator=generator)
            positions = torch.full((batch, 1), context - 1, device=device, dtype=torch.long)

            mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

            def step():
                """One decode step (the forward and its synchronisation), its seconds; the caches
                then hold `context` rows until `caches.reset()`."""
                if args.mode == "reduce-overhead" and mark_step is not None:
                    mark_step()
                t = time.time()
                with torch.no_grad():
                    forward(input_ids=ids, position_ids=positions, past_key_values=caches.cache, use_cache=True, logits_to_keep=1)
                sync()
                return time.time() - t

            first = time.time()
            step()
            point["first_call_s"] = time.time() - first
            # The step must have attended over context-1 cached rows plus its own: else it timed other work.
            caches.check(context, "after the first step")
            caches.reset()
            caches.check(context - 1, "after a step's reset")
            for _ in range(args.warmup):
                step()
                caches.check(context, "after a warm-up step")
                caches.reset()
            times = []
            for i in range(args.steps):
                times.append(step())
                if i == args.steps - 1:
                    caches.check(context, "after the last timed step")
                caches.reset()
            point["step_s"] = stats(times)
            point["tokens_per_s"] = batch / point["step_s"]["median"]
            point["compile_s"] = max(point["first_call_s"] - point["step_s"]["median"], 0.0) if args.mode != "eager" else None
            del caches
            if device == "cuda":
                torch.cuda.empty_cache()
            save()
    firsts = [p["compile_s"] for p in record["decode"] if p.get("compile_s") is not None]
    record["compile_s"] = sum(firsts) if firsts else None
    record["status"] = "ok"
    save()


def drive(args):
    """Runs each mode in a child process under the timeout and merges what they wrote."""
    out_dir = os.path.dirname(os.path.abspath(args.out))
    doc = {
        "schema": SCHEMA,
        "tool": "transformers",
        "command": " ".join(["python3"] + sys.argv),
        "date": utc_now(),
        "model": "tiny" if args.tiny else args.model,
        "contexts_stated_by": "random cache rows (no prefill)",
        "versions": {},
        "device": {},
        "modes": [],
    }
    try:
        import torch
        import transformers

        doc["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda}
        if torch.cuda.is_available():
            doc["device"] = {"name": torch.cuda.get_device_name()}
    except ImportError as e:
        doc["versions"] = {"error": str(e)}
    for mode in args.modes:
        part = os.path.join(out_dir, f".hf-{mode}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode, "--out", part,
               "--model", args.model, "--batch", ",".join(map(str, args.batch)),
               "--context", ",".join(map(str, args.context)), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--seed", str(args.seed)] + (["--tiny"] if args.tiny else [])
        start = time.time()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            failed = proc.returncode != 0
            error = (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1] if failed else None
            log = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            failed, error = True, f"timeout after {args.timeout} s"
            log = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        record = json.load(open(part)) if os.path.exists(part) else {"mode": mode, "decode": []}
        if failed:
            record["status"] = "failed"
            record["error"] = error
        record["wall_s"] = time.time() - start
        with open(os.path.join(out_dir, f"hf-{mode}.log"), "w") as f:
            f.write(log)
        doc["modes"].append(record)
        json.dump(doc, open(args.out, "w"), indent=1)
        print(f"{mode}: {record['status']}" + (f" ({error})" if failed else ""), flush=True)
        if os.path.exists(part):
            os.remove(part)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/glm5-slice.ron")
    ap.add_argument("--modes", default="eager", help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("--batch", type=ints, default=[1, 8])
    ap.add_argument("--context", type=ints, default=[1024, 8192])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per mode")
    ap.add_argument("--out", default="hf.json")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.modes + ([args.mode] if args.mode else []):
        if m not in MODES:
            ap.error(f"unknown mode {m!r}: use {', '.join(MODES)}")
    if args.dry_run:
        kwargs = tiny_kwargs() if args.tiny else hf_config_kwargs(read_ron(args.model))
        print(json.dumps({"config": kwargs, "modes": args.modes, "batch": args.batch, "context": args.context,
                          "steps": args.steps, "warmup": args.warmup}, indent=1))
        return
    if args.child:
        try:
            run_mode(args)
        except Exception:
            traceback.print_exc()
            sys.exit(1)
        return
    drive(args)


if __name__ == "__main__":
    main()
