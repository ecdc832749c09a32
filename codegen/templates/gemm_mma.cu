{% include "gemm_head.cuh" %}
    // Tensor-core GEMM for many rows (prefill): bf16 operands, f32 accumulation with
    // mma.sync.m16n8k16, the instruction SM120 has (no wgmma, no tcgen05). Block tile
    // {{ bm }} × {{ bn }} on 8 warps as {{ warps_m }} (rows) × {{ warps_n }} (columns), each warp
    // a 16·MI × 8·NI tile, so one 16-wide k step is MI + NI/2 ldmatrix.x4 for MI·NI MMAs (wider warp
    // tiles read shared memory less per MMA, the bound of this kernel). K moves in steps of 32
    // through a {{ stages }}-stage cp.async ring in dynamic shared memory,
    // {{ stages }} × ({{ bm }} + {{ bn }}) × 40 bf16 (held to SM120's 99 KiB): the next tiles are in flight
    // while one is multiplied (mma_mainloop in common.cuh). Rows past `rows` and columns past N
    // are zero-filled on the way in and skipped on the way out; K is a multiple of 8 (16-byte
    // copies).
    constexpr int BM = {{ bm }}, BN = {{ bn }}, BK = 32, LDS = BK + 8, STAGES = {{ stages }};
    constexpr int THREADS = 256, WARPS_M = {{ warps_m }}, WARPS_N = {{ warps_n }};
    constexpr int MI = BM / WARPS_M / 16, NI = BN / WARPS_N / 8;
    constexpr int X_VECS = BM * BK / 8 / THREADS, W_VECS = BN * BK / 8 / THREADS;
    constexpr int N_TILES = (COLS + BN - 1) / BN;
    constexpr int STEPS = (K + BK - 1) / BK;
    bf16* const sx = reinterpret_cast<bf16*>(dynamic_smem);  // [STAGES][BM][LDS]
    bf16* const sw = sx + STAGES * BM * LDS;                 // [STAGES][BN][LDS]

    const Tile tile = tile_of(blockIdx.x, N_TILES, BM);
    const int nt = tile.nt, h = tile.h;
    const i64 m0 = tile.m0;
    if (m0 >= rows) return;
    const int n0 = nt * BN;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N, g = lane >> 2, t4 = lane & 3;

    // Vector v = tid + i·256 of a tile is row v / 4, columns (v % 4)·8: each thread copies
    // X_VECS 16-byte vectors of x and W_VECS of w per stage. Rows without data read nothing and
    // land as zeros.
    const int cc = (tid & 3) * 8;
    const bf16* xs[X_VECS];
    const bf16* ws[W_VECS];
    bool x_ok[X_VECS], w_ok[W_VECS];
#pragma unroll
    for (int i = 0; i < X_VECS; ++i) {
        const i64 r = m0 + ((tid + i * THREADS) >> 2);
        x_ok[i] = r < rows;
        xs[i] = x + (x_ok[i] ? x_offset(r, h, x_outer, x_row, x_inner_rows, x_head) : 0) + cc;
    }
#pragma unroll
    for (int i = 0; i < W_VECS; ++i) {
        const int c = column(n0 + ((tid + i * THREADS) >> 2));
        w_ok[i] = c >= 0;
        ws[i] = w + (i64)h * N * K + (w_ok[i] ? (i64)c * K : 0) + cc;
    }
    auto load = [&](int stage, int k0) {
        const bool in_k = k0 + cc < K;
#pragma unroll
        for (int i = 0; i < X_VECS; ++i) {
            const int at = ((tid + i * THREADS) >> 2) * LDS + cc;
            cp_async16(&sx[stage * BM * LDS + at], x_ok[i] && in_k ? xs[i] + k0 : x, x_ok[i] && in_k);
        }
#pragma unroll
        for (int i = 0; i < W_VECS; ++i) {
            const int at = ((tid + i * THREADS) >> 2) * LDS + cc;
            cp_async16(&sw[stage * BN * LDS + at], w_ok[i] && in_k ? ws[i] + k0 : w, w_ok[i] && in_k);
        }
    };

    float acc[MI][NI][4];
    mma_mainloop<BM, BN, STAGES, MI, NI>(acc, sx, sw, STEPS, wm, wn, lane, load);

    // Accumulator e of an 8-column tile is row g + (e / 2) * 8, column t4 * 2 + e % 2.
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const i64 r = m0 + wm * MI * 16 + mi * 16 + g + half * 8;
            if (r >= rows) continue;
#pragma unroll
            for (int ni = 0; ni < NI; ++ni)
                store2(y + r * y_row + h * y_head, wn * NI * 8 + n0 + ni * 8 + t4 * 2,
                       acc[mi][ni][half * 2], acc[mi][ni][half * 2 + 1], positions, r, rows_per_position);
        }
}
