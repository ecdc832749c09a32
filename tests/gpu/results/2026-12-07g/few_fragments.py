# The fragment layout of codegen/templates/mla_absorbed_few.cu on one 16-key tile, with ldmatrix
# (plain and .trans) and mma.m16n8k16 emulated as PTX defines them (tests/gpu/mma_emulation.py):
# prints the largest error of the kernel's Sᵀ = K·Qᵀ (summed over its eight warps' partials) and
# Oᵀ = Vᵀ·Pᵀ. Needs numpy.
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from mma_emulation import ldmatrix_x4, mma, zeros  # noqa: E402

rng = np.random.default_rng(0)
D1, D, LDK = 512, 576, 584
K = rng.standard_normal((16, D))
Q = rng.standard_normal((8, D))
smem = np.zeros((16, LDK))
smem[:, :D] = K
# Sᵀ partials per warp, head-major.
sp = np.zeros((8, 8, 24))
for warp in range(8):
    acc = zeros()
    for i in range(5):
        k0 = (warp + 8 * i) * 16
        if k0 >= D:
            continue
        a = ldmatrix_x4(smem, lambda l: (l & 15, k0 + (l >> 4) * 8))
        b = {T: [tuple(Q[T // 4][k0 + h * 8 + (T % 4) * 2:][:2]) for h in range(2)] for T in range(32)}
        acc = mma(acc, a, b)
    for T in range(32):
        g, t4 = T // 4, T % 4
        sp[warp, 2 * t4, g], sp[warp, 2 * t4 + 1, g] = acc[T][0], acc[T][1]
        sp[warp, 2 * t4, g + 8], sp[warp, 2 * t4 + 1, g + 8] = acc[T][2], acc[T][3]
S = sp.sum(0)[:, :16]  # [head][key]
print("S err", abs(S - Q @ K.T).max())
# The softmax's inputs per lane are exactly the keys of its Pᵀ fragment.
P = rng.standard_normal((8, 16))  # stand-in probabilities [head][key]
pb = {}
for T in range(32):
    g, t4 = T // 4, T % 4
    keys = (2 * t4, 2 * t4 + 1, 2 * t4 + 8, 2 * t4 + 9)
    assert np.allclose([S[g][k] for k in keys], [(Q @ K.T)[g][k] for k in keys])
    pb[T] = [(P[g][2 * t4], P[g][2 * t4 + 1]), (P[g][2 * t4 + 8], P[g][2 * t4 + 9])]
O = np.zeros((8, 512))
for warp in range(8):
    for mi in range(4):
        a = ldmatrix_x4(smem, lambda l: ((l & 7) + (l >> 4) * 8, warp * 64 + mi * 16 + ((l >> 3) & 1) * 8), True)
        acc = mma(zeros(), a, pb)
        for T in range(32):
            g, t4 = T // 4, T % 4
            for half in range(2):
                for e in range(2):
                    O[2 * t4 + e, warp * 64 + mi * 16 + g + half * 8] = acc[T][half * 2 + e]
print("O err", abs(O - P @ K[:, :512]).max())
