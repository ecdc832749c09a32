# ldmatrix (.x4, plain and .trans) and mma.sync.m16n8k16 emulated on the CPU as PTX defines their
# fragments, for checking a kernel's fragment layout (the scripts under results/ that import it).
# A fragment is a dict from lane T (g = T // 4, t4 = T % 4) to its registers, each a pair of
# values (A and B operands) or one value (accumulators).
import numpy as np


def ldmatrix_x4(smem, row_col_of_lane, trans=False):
    """Four 8×8 matrices, matrix i's row r at smem[row, col:col + 8] for (row, col) =
    row_col_of_lane(8i + r); lane T gets, from each, the pair at row T // 4, columns 2·(T % 4)
    and + 1 (transposed: column T // 4, rows 2·(T % 4) and + 1)."""
    mats = []
    for i in range(4):
        rows = [row_col_of_lane(8 * i + r) for r in range(8)]
        mats.append(np.array([[smem[row, col + c] for c in range(8)] for row, col in rows]))
    if trans:
        mats = [m.T for m in mats]
    return {T: [(m[T // 4][2 * (T % 4)], m[T // 4][2 * (T % 4) + 1]) for m in mats] for T in range(32)}


def mma(acc, a, b):
    """acc + A·B for the m16n8k16 fragments acc (4 values a lane), a (4 pairs) and b (2 pairs)."""
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


def zeros():
    return {T: [0.0] * 4 for T in range(32)}
