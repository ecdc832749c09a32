# The fragment layout of codegen/templates/mla_absorbed_wide.cu's key_rows form on one 32-key
# tile of 32 heads, ldmatrix and mma.m16n8k16 emulated as PTX defines them
# (tests/gpu/mma_emulation.py): each warp's Qᵀ B fragments (the kernel's Q loads), its K A
# fragments (ldmatrix_x4 at the kernel's addresses, LDK-padded rows), its Sᵀ accumulators and
# their stores into the head-major partials; prints the largest error of the four summed
# partials (what the softmax reads) against Q·Kᵀ, NaN if an entry went unwritten. Needs numpy.
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from mma_emulation import ldmatrix_x4, mma, zeros  # noqa: E402

rng = np.random.default_rng(0)
D, LDK, HG, BN, QUARTER, KSTEPS, LDS = 576, 584, 32, 32, 144, 9, 40
K = rng.standard_normal((BN, D))
Q = rng.standard_normal((HG, D))
smem = np.zeros((BN, LDK))
smem[:, :D] = K
sp = np.full((4, HG, LDS), np.nan)
for warp in range(8):
    kh, kq = warp & 1, warp >> 1
    acc = [zeros() for _ in range(HG // 8)]
    for i in range(KSTEPS):
        a = ldmatrix_x4(smem, lambda l: (kh * 16 + (l & 15), kq * QUARTER + i * 16 + (l >> 4) * 8))
        for nt in range(HG // 8):
            b = {T: [tuple(Q[nt * 8 + T // 4][kq * QUARTER + i * 16 + half * 8 + (T % 4) * 2:][:2])
                     for half in range(2)] for T in range(32)}
            acc[nt] = mma(acc[nt], a, b)
    for T in range(32):
        g, t4 = T // 4, T % 4
        for nt in range(HG // 8):
            h, key = nt * 8 + 2 * t4, kh * 16 + g
            sp[kq, h, key], sp[kq, h + 1, key] = acc[nt][T][0], acc[nt][T][1]
            sp[kq, h, key + 8], sp[kq, h + 1, key + 8] = acc[nt][T][2], acc[nt][T][3]
S = sp[:, :, :BN].sum(0)
print("S err", abs(S - Q @ K.T).max())
