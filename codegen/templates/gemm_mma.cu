{% include "gemm_head.cuh" %}
    // Tensor-core GEMM for many rows (prefill): bf16 operands, f32 accumulation with
    // mma.sync.m16n8k16, the instruction SM120 has (no wgmma, no tcgen05). Block tile 128 × 128
    // on 8 warps as 4 (rows) × 2 (columns) of 32 × 64 each, so one 16-wide k step is 2 + 4
    // ldmatrix.x4 for 16 MMAs. K moves in steps of 32 through a 4-stage cp.async ring in dynamic
    // shared memory, 4 × (128 + 128) × 40 bf16 = 80 KiB of SM120's 99 KiB: three tiles are in
    // flight while the fourth is multiplied, which hides global latency without a second block
    // per SM. The 8-element row pad (80-byte rows) puts the eight 16-byte rows an ldmatrix phase
    // reads on distinct banks. Rows past `rows` and columns past N are zero-filled on the way in
    // and skipped on the way out; K is a multiple of 8 (16-byte copies).
    constexpr int BM = 128, BN = 128, BK = 32, LDS = BK + 8, STAGES = 4;
    constexpr int N_TILES = (COLS + BN - 1) / BN;
    constexpr int STEPS = (K + BK - 1) / BK;
    bf16* const sx = reinterpret_cast<bf16*>(dynamic_smem);  // [STAGES][BM][LDS]
    bf16* const sw = sx + STAGES * BM * LDS;                 // [STAGES][BN][LDS]

    i64 b = blockIdx.x;
    const int nt = (int)(b % N_TILES);
    b /= N_TILES;
    const int h = (int)(b % HEADS);
    const i64 m0 = b / HEADS * BM;
    if (m0 >= rows) return;  // the grid is rounded up to whole row tiles
    const int n0 = nt * BN;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp >> 1, wn = warp & 1, g = lane >> 2, t4 = lane & 3;

    // Each thread copies two 16-byte vectors of each tile per stage: rows tid/4 and tid/4 + 64,
    // columns (tid % 4) * 8. Rows without data read nothing and land as zeros.
    const int cr = tid >> 2, cc = (tid & 3) * 8;
    const bf16* xs[2];
    const bf16* ws[2];
    bool x_ok[2], w_ok[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const i64 r = m0 + cr + i * 64;
        x_ok[i] = r < rows;
        xs[i] = x + (x_ok[i] ? x_offset(r, h, x_outer, x_row, x_inner_rows, x_head) : 0) + cc;
        const int c = column(n0 + cr + i * 64);
        w_ok[i] = c >= 0;
        ws[i] = w + (i64)h * N * K + (w_ok[i] ? (i64)c * K : 0) + cc;
    }
    auto load = [&](int stage, int k0) {
        const bool in_k = k0 + cc < K;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int at = (cr + i * 64) * LDS + cc;
            cp_async16(&sx[stage * BM * LDS + at], x_ok[i] && in_k ? xs[i] + k0 : x, x_ok[i] && in_k);
            cp_async16(&sw[stage * BN * LDS + at], w_ok[i] && in_k ? ws[i] + k0 : w, w_ok[i] && in_k);
        }
    };

    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < STEPS) load(s, s * BK);
        cp_async_commit();
    }
    for (int s = 0; s < STEPS; ++s) {
        cp_async_wait<STAGES - 2>();
        // Tile s has landed for every thread, and every warp is done with tile s - 1, whose
        // stage the next copy overwrites.
        __syncthreads();
        if (s + STAGES - 1 < STEPS) load((s + STAGES - 1) % STAGES, (s + STAGES - 1) * BK);
        cp_async_commit();
        const bf16* tx = sx + (s % STAGES) * BM * LDS;
        const bf16* tw = sw + (s % STAGES) * BN * LDS;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            // A: lanes 0-15 address rows 0-15 at k, lanes 16-31 the same rows at k + 8 (a0..a3).
            // B: each x4 holds (b0, b1) of two 8-column tiles: lanes 0-7 columns 0-7 at k, 8-15
            // the same at k + 8, 16-31 columns 8-15.
            unsigned a[2][4], bq[4][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
                ldmatrix_x4(a[mi], tx + (wm * 32 + mi * 16 + (lane & 15)) * LDS + kk + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < 4; ++nj)
                ldmatrix_x4(bq[nj], tw + (wn * 64 + nj * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS + kk
                                        + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 8; ++ni)
                    mma_bf16(acc[mi][ni], a[mi], bq[ni >> 1][(ni & 1) * 2], bq[ni >> 1][(ni & 1) * 2 + 1]);
        }
    }

    // Accumulator e of an 8-column tile is row g + (e / 2) * 8, column t4 * 2 + e % 2.
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const i64 r = m0 + wm * 32 + mi * 16 + g + half * 8;
            if (r >= rows) continue;
#pragma unroll
            for (int ni = 0; ni < 8; ++ni)
                store2(y + r * y_row + h * y_head, n0 + wn * 64 + ni * 8 + t4 * 2,
                       acc[mi][ni][half * 2], acc[mi][ni][half * 2 + 1], positions, r, rows_per_position);
        }
}
