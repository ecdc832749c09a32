#!/usr/bin/env python3
"""torch.matmul on the GEMM shapes the GPU harness timed (gemm.json), for comparison.

Usage: torch_gemm.py GEMM_JSON OUT_MD. Each shape is timed the way the harness times glmc's
kernel: rotating through copies of the operands (at least 120 MB, so from DRAM), back to back in
one CUDA graph. Per-head GEMMs run as one
torch.bmm over contiguous [heads, rows, K] operands (torch's best layout; glmc reads the heads in
place, strided). f32 stays f32 (TF32 off, torch's default for matmul).
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "peers"))
from torch_matmul import time_gemm  # noqa: E402


def main():
    shapes = json.load(open(sys.argv[1]))
    torch.backends.cuda.matmul.allow_tf32 = False
    lines = [
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}",
        "| phase | rows | node | heads × N × K | dtype | glmc (us) | torch (us) | glmc / torch | glmc TFLOP/s | torch TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in shapes:
        rows, heads, n, k = s["rows"], s["heads"], s["n"], s["k"]
        us = time_gemm(heads, rows, n, k, s["dtype"])
        flops = 2.0 * heads * rows * n * k
        lines.append(
            f"| {s['phase']} | {rows} | {s['node']} | {heads} × {n} × {k} | {s['dtype']} | "
            f"{s['glmc_us']:.1f} | {us:.1f} | {s['glmc_us'] / us:.2f} | "
            f"{flops / s['glmc_us'] / 1e6:.1f} | {flops / us / 1e6:.1f} |"
        )
    open(sys.argv[2], "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
