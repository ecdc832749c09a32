# The fragment layout of mla_absorbed_wide64.cu (issue 14's 64-head attention,
# `Variant::Mla(MlaKernel::Wide64)`) checked on the CPU: one 32-key tile of all 64 heads through
# the kernel's lane formulas (the queries' A fragments from global memory, the keys' ldmatrix,
# the score halves' swizzled stores and the softmax's loads, the probabilities' and values'
# ldmatrix for O += P·V), with ldmatrix and the MMA emulated as PTX defines them
# (tests/gpu/mma_emulation.py), against numpy's Q·Kᵀ and softmax(S)·V. Also checks that the
# swizzle is a permutation of each row and that the float2 stores and float4 loads meet no bank
# twice. Needs numpy. Run: python3 tests/gpu/results/2026-12-08a/wide64_fragments.py
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from mma_emulation import ldmatrix_x4, mma, zeros  # noqa: E402

D1, D, BN, HG, HALF, KSTEPS = 512, 576, 32, 64, 288, 18
LDK, LDP = D + 8, BN + 8
rng = np.random.default_rng(7)
Q = rng.standard_normal((HG, D))
K = rng.standard_normal((BN, D))
ks = np.zeros((BN, LDK))
ks[:, :D] = K


def swizzle(r):
    return (((r & 3) << 1) | (r & 1)) << 2


# S: warp (hq = w % 4, kh = w // 4), the partials in sp[kh][row][physical column].
sp = np.full((2, HG, BN), np.nan)
for w in range(8):
    hq, kh = w & 3, w >> 2
    qa = []
    for i in range(KSTEPS):
        frag = {}
        for T in range(32):
            g, t4 = T >> 2, T & 3
            h, c = hq * 16 + g, kh * HALF + i * 16 + t4 * 2
            frag[T] = [tuple(Q[h, c:c + 2]), tuple(Q[h + 8, c:c + 2]), tuple(Q[h, c + 8:c + 10]),
                       tuple(Q[h + 8, c + 8:c + 10])]
        qa.append(frag)
    acc = [zeros() for _ in range(4)]
    for i in range(KSTEPS):
        for p in range(2):
            r = ldmatrix_x4(ks, lambda lane: (p * 16 + (lane >> 4) * 8 + (lane & 7),
                                              kh * HALF + ((lane >> 3) & 1) * 8 + i * 16))
            acc[2 * p] = mma(acc[2 * p], qa[i], {T: r[T][0:2] for T in range(32)})
            acc[2 * p + 1] = mma(acc[2 * p + 1], qa[i], {T: r[T][2:4] for T in range(32)})
    for T in range(32):
        g, t4 = T >> 2, T & 3
        for nt in range(4):
            col = (nt * 8 + t4 * 2) ^ swizzle(g)
            for dr in (0, 8):
                row = hq * 16 + g + dr
                assert swizzle(row) == swizzle(g)
                e = 0 if dr == 0 else 2
                sp[kh, row, col:col + 2] = acc[nt][T][e:e + 2]
assert not np.isnan(sp).any(), "every partial written"

# Softmax: thread tid holds row tid // 4, keys (tid % 4)·8..; one tile from a fresh state.
S = np.zeros((HG, BN))
for tid in range(256):
    srow, scol = tid >> 2, (tid & 3) * 8
    for u in range(2):
        col = (scol + u * 4) ^ swizzle(srow)
        S[srow, scol + u * 4:scol + u * 4 + 4] = sp[0, srow, col:col + 4] + sp[1, srow, col:col + 4]
want_s = Q @ K.T
err_s = np.abs(S - want_s).max()
P = np.exp2(S - S.max(axis=1, keepdims=True))
ps = np.zeros((HG, LDP))
ps[:, :BN] = P

# O: warp w owns columns w·64.. of all 64 heads.
O = np.full((HG, D1), np.nan)
for w in range(8):
    o = [[zeros() for _ in range(8)] for _ in range(4)]
    for kk in (0, 16):
        a = [ldmatrix_x4(ps, lambda lane: (mi * 16 + (lane & 15), kk + (lane >> 4) * 8)) for mi in range(4)]
        for j in range(4):
            b = ldmatrix_x4(ks, lambda lane: (kk + (lane & 7) + ((lane >> 3) & 1) * 8,
                                              w * 64 + (lane >> 4) * 8 + j * 16), trans=True)
            for mi in range(4):
                o[mi][2 * j] = mma(o[mi][2 * j], a[mi], {T: b[T][0:2] for T in range(32)})
                o[mi][2 * j + 1] = mma(o[mi][2 * j + 1], a[mi], {T: b[T][2:4] for T in range(32)})
    for T in range(32):
        g, t4 = T >> 2, T & 3
        for mi in range(4):
            for nt in range(8):
                c = w * 64 + nt * 8 + t4 * 2
                O[mi * 16 + g, c:c + 2] = o[mi][nt][T][0:2]
                O[mi * 16 + g + 8, c:c + 2] = o[mi][nt][T][2:4]
want_o = P @ K[:, :D1]
err_o = np.abs(O - want_o).max()

# Banks: a half warp's float2 stores (rows hq·16 + g, g < 4 or ≥ 4) and a quarter warp's float4
# loads each cover the 32 banks once.
for hw in range(2):
    for nt in range(4):
        banks = {(r * BN + ((nt * 8 + t4 * 2) ^ swizzle(r)) + e) % 32
                 for r in range(4 * hw, 4 * hw + 4) for t4 in range(4) for e in range(2)}
        assert len(banks) == 32
for q in range(32):
    for u in range(2):
        banks = {(srow * BN + ((scol + u * 4) ^ swizzle(srow)) + e) % 32
                 for tid in range(8 * q, 8 * q + 8)
                 for srow, scol in [(tid >> 2, (tid & 3) * 8)] for e in range(4)}
        assert len(banks) == 32
for r in range(HG):
    assert sorted(c ^ swizzle(r) for c in range(BN)) == list(range(BN))

print(f"S within {err_s:.1e} of Q·Kᵀ, O within {err_o:.1e} of softmax·V (largest |O| {np.abs(want_o).max():.1f})")
assert err_s < 1e-9 and err_o < 1e-9
