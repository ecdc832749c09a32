#!/usr/bin/env python3
"""What torch.matmul launches for the decode GEMMs glmc loses to it (q_b_proj, wq_b): run under
Nsight Compute with `--nvtx --nvtx-include probe/`, each shape twice eagerly with weights from
DRAM (a fresh copy each call), so that ncu's LaunchStats give cuBLAS's kernels, grids, blocks,
registers and shared memory, in the order of SHAPES (the random fills stay outside the range)."""
import torch

SHAPES = [(1, 16384, 2048), (8, 16384, 2048), (1, 4096, 2048), (8, 4096, 2048)]
for rows, n, k in SHAPES:
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("probe")
    for w in ws:
        torch.matmul(x, w.t())
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"{rows} × {n} × {k}: two calls")
