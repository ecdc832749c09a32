{% include "gemm_head.cuh" %}
    // Baseline SIMT GEMM, any dtype: one block of 256 threads per 64 × 64 output tile of one head,
    // K in steps of 16 through shared memory (2 × 16 × 68 f32 = 8.5 KiB), each thread a 4 × 4
    // register tile accumulated with f32 FMA; every edge is predicated, so any row count and any
    // K or N works. Blocks past the last row tile (the grid is rounded up) exit at once.
    constexpr int BM = 64, BN = 64, BK = 16;
    constexpr int N_TILES = (COLS + BN - 1) / BN;
    __shared__ float as[BK][BM + 4];
    __shared__ float bs[BK][BN + 4];

    const Tile tile = tile_of(blockIdx.x, N_TILES, BM);
    const int nt = tile.nt, h = tile.h;
    const i64 m0 = tile.m0;
    if (m0 >= rows) return;

    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int lr = tid / 4, lk = (tid % 4) * 4;
    const i64 a_row = m0 + lr;
    const bool a_ok = a_row < rows;
    const {{ x_t }}* xa = x + (a_ok ? x_offset(a_row, h, x_outer, x_row, x_inner_rows, x_head) : 0);
    const int b_col = column(nt * BN + lr);
    const {{ w_t }}* wb = w + (i64)h * N * K + (b_col >= 0 ? (i64)b_col * K : 0);

    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int kk = k0 + lk + i;
            as[lk + i][lr] = a_ok && kk < K ? ld(xa + kk) : 0.f;
            bs[lk + i][lr] = b_col >= 0 && kk < K ? ld(wb + kk) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = as[kk][ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx * 4 + j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const i64 r = m0 + ty * 4 + i;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < 4; j += 2)
            store2(y + r * y_row + h * y_head, nt * BN + tx * 4 + j, acc[i][j], acc[i][j + 1],
                   positions, r, rows_per_position);
    }
}
