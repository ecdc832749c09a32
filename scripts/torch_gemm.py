#!/usr/bin/env python3
"""torch.matmul on the GEMM shapes the GPU harness timed (gemm.json), for comparison.

Usage: torch_gemm.py GEMM_JSON OUT_MD. Each shape is timed the way the harness times glmc's
kernel: one warm-up, then 20 back-to-back runs between two CUDA events. Per-head GEMMs run as one
torch.bmm over contiguous [heads, rows, K] operands (torch's best layout; glmc reads the heads in
place, strided). f32 stays f32 (TF32 off, torch's default for matmul).
"""
import json
import sys

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


def main():
    shapes = json.load(open(sys.argv[1]))
    torch.backends.cuda.matmul.allow_tf32 = False
    lines = [
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}",
        "| phase | rows | node | heads × N × K | dtype | glmc (us) | torch (us) | glmc / torch | glmc TFLOP/s | torch TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in shapes:
        dtype = torch.bfloat16 if s["dtype"] == "bf16" else torch.float32
        rows, heads, n, k = s["rows"], s["heads"], s["n"], s["k"]
        x = torch.randn(heads, rows, k, device="cuda", dtype=dtype)
        w = torch.randn(heads, n, k, device="cuda", dtype=dtype)
        if heads == 1:
            x2, w2 = x[0], w[0]
            us = time_us(lambda: torch.matmul(x2, w2.t()))
        else:
            us = time_us(lambda: torch.bmm(x, w.transpose(1, 2)))
        flops = 2.0 * heads * rows * n * k
        lines.append(
            f"| {s['phase']} | {rows} | {s['node']} | {heads} × {n} × {k} | {s['dtype']} | "
            f"{s['glmc_us']:.1f} | {us:.1f} | {s['glmc_us'] / us:.2f} | "
            f"{flops / s['glmc_us'] / 1e6:.1f} | {flops / us / 1e6:.1f} |"
        )
        del x, w
    open(sys.argv[2], "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
