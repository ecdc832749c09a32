#!/usr/bin/env python3
"""gemm_x_stage.cuh's index arithmetic, lane by lane, against the fragments gemm_skinny.cu's
load_x reads from global memory (the twenty-third session, tests/gpu/README.md).

For K of 192, 512 and 2048 (GLM-5's q_absorbed, attn and wq_b / q_b_proj), 8 and 16 staged rows
and every row count a 16-row tile takes: stage_x's copies (warp w rows w, w + 8, ...; lane l the
16-byte vectors l, l + 32, ...; zeros past the last row) fill xs, and x_staged's reads of every
chunk, lane and half must equal load_x's (row m0 + g + 8 half, elements k0 + 8 t4 .. + 7; zero
past K or the last row). Also checks that the eight lanes of each LDS.128 quarter-warp phase read
32 distinct banks. Exits non-zero on the first mismatch. Python 3 alone, no GPU."""
import random
import sys

WARPS, CHUNK = 8, 32


def ldx(k):
    return k + 2 * ((48 - k // 2 % 32) % 32)


def check(k, x_rows, rows, m0=0):
    lx = ldx(k)
    x = [[random.randrange(1, 1 << 16) for _ in range(k)] for _ in range(m0 + rows)]
    xs = [None] * (x_rows * lx)
    # stage_x
    if min(m0 + rows - m0, 16) > x_rows:
        return "not staged"
    vecs = k // 8
    for warp in range(WARPS):
        for lane in range(32):
            for i in range(x_rows // WARPS):
                r = warp + i * WARPS
                ok = m0 + r < m0 + rows
                for j in range((vecs + 31) // 32):
                    c = lane + 32 * j
                    if c < vecs:
                        for e in range(8):
                            xs[r * lx + c * 8 + e] = x[m0 + r][c * 8 + e] if ok else 0
    chunks = (k + CHUNK - 1) // CHUNK
    for ch in range(chunks + 2):
        k0 = ch * CHUNK
        for lane in range(32):
            g, t4 = lane >> 2, lane & 3
            in_k = ch < chunks and k0 + t4 * 8 < k
            at = g * lx + (k0 if in_k else 0) + t4 * 8
            staged = [xs[at:at + 8] if in_k else [0] * 8,
                      xs[at + 8 * lx:at + 8 * lx + 8] if x_rows > 8 and in_k else [0] * 8]
            for half in range(2):
                r = g + half * 8
                want = x[m0 + r][k0 + t4 * 8:k0 + t4 * 8 + 8] if in_k and r < rows else [0] * 8
                if staged[half] != want:
                    sys.exit(f"K={k} x_rows={x_rows} rows={rows} chunk {ch} lane {lane} half {half}: "
                             f"{staged[half]} != {want}")
        # Banks of each quarter-warp phase of an LDS.128 (4-byte words, 32 banks).
        if ch < chunks:
            for half in range(2 if x_rows > 8 else 1):
                for phase in range(4):
                    banks = set()
                    for lane in range(8 * phase, 8 * phase + 8):
                        g, t4 = lane >> 2, lane & 3
                        word = ((g + 8 * half) * lx + k0 + t4 * 8) // 2
                        banks.update((word + w) % 32 for w in range(4))
                    if len(banks) != 32:
                        sys.exit(f"K={k} x_rows={x_rows} chunk {ch} half {half} phase {phase}: "
                                 f"{len(banks)} banks")
    return "staged"


def main():
    random.seed(23)
    seen = {}
    for k, x_rows in [(192, 16), (512, 16), (2048, 8)]:
        for rows in range(1, 17):
            out = check(k, x_rows, rows)
            seen[out] = seen.get(out, 0) + 1
            if out == "not staged" and rows <= x_rows:
                sys.exit(f"K={k} x_rows={x_rows}: {rows} rows not staged")
    print(f"every fragment of every chunk equal to load_x's, every LDS.128 phase on 32 banks: {seen}")


if __name__ == "__main__":
    main()
