# The fragment layout of codegen/templates/mla_absorbed_wide.cu's key_rows form on one 32-key
# tile of 32 heads, ldmatrix and mma.m16n8k16 emulated as PTX defines them (as in
# ../2026-12-07g/few_fragments.py): each warp's Qᵀ B fragments (the kernel's Q loads), its K A
# fragments (ldmatrix_x4 at the kernel's addresses, LDK-padded rows), its Sᵀ accumulators and
# their stores into the head-major partials; prints the largest error of the four summed
# partials (what the softmax reads) against Q·Kᵀ. Needs numpy.
import numpy as np

rng = np.random.default_rng(0)
D1, D, LDK, HG, BN, QUARTER, KSTEPS, LDS = 512, 576, 584, 32, 32, 144, 9, 40
K = rng.standard_normal((BN, D))
Q = rng.standard_normal((HG, D))
smem = np.zeros((BN, LDK))
smem[:, :D] = K


def ldmatrix_x4(row_col_of_lane):
    mats = [np.array([[smem[row_col_of_lane(8 * i + r)[0], row_col_of_lane(8 * i + r)[1] + c]
                       for c in range(8)] for r in range(8)]) for i in range(4)]
    return {T: [(M[T // 4][2 * (T % 4)], M[T // 4][2 * (T % 4) + 1]) for M in mats] for T in range(32)}


def mma(acc, a, b):
    A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    for T in range(32):
        g, t4 = T // 4, T % 4
        A[g, 2 * t4:2 * t4 + 2] = a[T][0]
        A[g + 8, 2 * t4:2 * t4 + 2] = a[T][1]
        A[g, 2 * t4 + 8:2 * t4 + 10] = a[T][2]
        A[g + 8, 2 * t4 + 8:2 * t4 + 10] = a[T][3]
        B[2 * t4:2 * t4 + 2, g] = b[T][0]
        B[2 * t4 + 8:2 * t4 + 10, g] = b[T][1]
        C[g, 2 * t4], C[g, 2 * t4 + 1], C[g + 8, 2 * t4], C[g + 8, 2 * t4 + 1] = acc[T]
    C = C + A @ B
    return {T: [C[T // 4, 2 * (T % 4)], C[T // 4, 2 * (T % 4) + 1], C[T // 4 + 8, 2 * (T % 4)],
                C[T // 4 + 8, 2 * (T % 4) + 1]] for T in range(32)}


sp = np.full((4, HG, LDS), np.nan)
for warp in range(8):
    kh, kq = warp & 1, warp >> 1
    qb = {T: [[[tuple(Q[nt * 8 + T // 4][kq * QUARTER + i * 16 + half * 8 + (T % 4) * 2:][:2])
                for half in range(2)] for nt in range(HG // 8)] for i in range(KSTEPS)] for T in range(32)}
    acc = [{T: [0.0] * 4 for T in range(32)} for _ in range(HG // 8)]
    for i in range(KSTEPS):
        a = ldmatrix_x4(lambda l: (kh * 16 + (l & 15), kq * QUARTER + (l >> 4) * 8 + i * 16))
        for nt in range(HG // 8):
            acc[nt] = mma(acc[nt], a, {T: qb[T][i][nt] for T in range(32)})
    for T in range(32):
        g, t4 = T // 4, T % 4
        for nt in range(HG // 8):
            base_h, key = nt * 8 + 2 * t4, kh * 16 + g
            sp[kq, base_h, key] = acc[nt][T][0]
            sp[kq, base_h + 1, key] = acc[nt][T][1]
            sp[kq, base_h, key + 8] = acc[nt][T][2]
            sp[kq, base_h + 1, key + 8] = acc[nt][T][3]
S = sp[:, :, :BN].sum(0)
print("S err", abs(S - Q @ K.T).max())
