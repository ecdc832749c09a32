#!/usr/bin/env python3
"""torch.matmul on the GEMM shapes of a `glmc bench --json` file, timed as glmc's are.

Usage: torch_matmul.py GLMC_JSON OUT_JSON

Every matmul node of the glmc run (its `gemm` shape: rows, heads, N, K) at each decode batch
(the smallest context's points: a GEMM does not depend on the context) and at the prefill,
layers folded (one shape per node kind; glmc's time is the mean over the layers). Each shape is
timed by `time_gemm`: rotating through copies of its operands so the weights come from DRAM, back
to back in a CUDA graph. Per-head GEMMs run as one torch.bmm over contiguous operands. f32 stays
f32 (no TF32).
Writes schema glmc-bench-matmul/1 (bench/render.py renders it).
"""
import json
import re
import sys
import time

import torch


# Bytes of operands a timing rotates through: twice the 60 MB L2 that issue 14 names, so the
# weights come from DRAM as they do in a model, where every layer has its own.
ROTATION_BYTES = 120 << 20


def time_rotating(op, copies, reps):
    """Microseconds per call of op(i) for i cycling through `copies`, `reps` calls back to back
    in one CUDA graph (after a warm-up of every copy, which also lets cuBLAS pick its kernel)."""
    for i in range(copies):
        op(i)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in range(reps):
            op(r % copies)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def time_gemm(heads, rows, n, k, dtype):
    """Microseconds of x·wᵀ for x [heads, rows, k] and w [heads, n, k] ("bf16" or "f32"):
    torch.matmul for one head, one torch.bmm over contiguous operands for several. Timed as
    glmc's GPU harness times its kernels: through copies of the operands that span at least
    ROTATION_BYTES (at most 64 copies), back to back in one CUDA graph."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    size = (heads * rows * k + heads * n * k) * (2 if dtype == "bf16" else 4)
    copies = min(max(1, -(-ROTATION_BYTES // size)), 64)
    reps = max(20, copies)
    xs = [torch.randn(heads, rows, k, device="cuda", dtype=dt) for _ in range(copies)]
    ws = [torch.randn(heads, n, k, device="cuda", dtype=dt) for _ in range(copies)]
    if heads == 1:
        return time_rotating(lambda i: torch.matmul(xs[i][0], ws[i][0].t()), copies, reps)
    return time_rotating(lambda i: torch.bmm(xs[i], ws[i].transpose(1, 2)), copies, reps)


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


def run_header(schema, tool):
    """The fields every torch result file of the benchmarks opens with: what made it, when, where."""
    return {
        "schema": schema,
        "tool": tool,
        "command": " ".join(["python3"] + sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": {"name": torch.cuda.get_device_name()},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
    }


def main():
    doc = json.load(open(sys.argv[1]))
    torch.backends.cuda.matmul.allow_tf32 = False
    result = dict(run_header("glmc-bench-matmul/1", "torch.matmul"), shapes=[])
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
