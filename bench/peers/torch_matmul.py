#!/usr/bin/env python3
"""torch.matmul on the GEMM shapes of a `glmc bench --json` file, timed as glmc's are.

Usage: torch_matmul.py GLMC_JSON OUT_JSON

Every matmul node of the glmc run (its `gemm` shape: rows, heads, N, K) at each decode batch
(the smallest context's points: a GEMM does not depend on the context) and at the prefill,
layers folded (one shape per node kind; glmc's time is the mean over the layers). Each shape is
timed like scripts/torch_gemm.py: one warm-up, then 20 back-to-back runs between two CUDA
events. Per-head GEMMs run as one torch.bmm over contiguous operands. f32 stays f32 (no TF32).
Writes schema glmc-bench-matmul/1 (bench/render.py renders it).
"""
import json
import re
import sys
import time

import torch


def time_us(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def time_gemm(heads, rows, n, k, dtype):
    """Microseconds of x·wᵀ for x [heads, rows, k] and w [heads, n, k] ("bf16" or "f32"):
    torch.matmul for one head, one torch.bmm over contiguous operands for several."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    x = torch.randn(heads, rows, k, device="cuda", dtype=dt)
    w = torch.randn(heads, n, k, device="cuda", dtype=dt)
    if heads == 1:
        x2, w2 = x[0], w[0]
        return time_us(lambda: torch.matmul(x2, w2.t()))
    return time_us(lambda: torch.bmm(x, w.transpose(1, 2)))


def shapes(doc):
    """{(phase, rows, folded node, heads, n, k, dtype): [glmc seconds per layer]}."""
    out = {}
    for run in doc["runs"]:
        points = [("prefill", p) for p in run.get("prefill", [])]
        decode = run.get("decode", [])
        if decode:
            cmin = min(p["context"] for p in decode)
            points += [("decode", p) for p in decode if p["context"] == cmin]
        for phase, p in points:
            for k in p["kernels"]:
                g = k.get("gemm")
                if not g:
                    continue
                node = re.sub(r"^model\.layers\.\d+\.", "model.layers.*.", k["node"])
                key = (phase, g["rows"], node, g["heads"], g["n"], g["k"], g["dtype"])
                out.setdefault(key, []).append(k["time_s"])
    return out


def main():
    doc = json.load(open(sys.argv[1]))
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {
        "schema": "glmc-bench-matmul/1",
        "tool": "torch.matmul",
        "command": " ".join(["python3"] + sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": {"name": torch.cuda.get_device_name()},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "shapes": [],
    }
    for (phase, rows, node, heads, n, k, dtype), times in sorted(shapes(doc).items()):
        us = time_gemm(heads, rows, n, k, dtype)
        result["shapes"].append(
            {"phase": phase, "rows": rows, "node": node, "heads": heads, "n": n, "k": k, "dtype": dtype,
             "glmc_us": sum(times) / len(times) * 1e6, "torch_us": us}
        )
    json.dump(result, open(sys.argv[2], "w"), indent=1)
    print(f"timed {len(result['shapes'])} shapes into {sys.argv[2]}")


if __name__ == "__main__":
    main()
