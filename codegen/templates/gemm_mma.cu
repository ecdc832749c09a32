{% include "gemm_head.cuh" %}
    // Tensor-core GEMM for many rows (a prefill; a decode batch above 16 rows): bf16 operands, f32 accumulation with
    // mma.sync.m16n8k16, the instruction SM120 has (no wgmma, no tcgen05). Block tile
    // {{ bm }} × {{ bn }} on {{ warps_m }} × {{ warps_n }} warps (rows × columns), each warp a
    // 16·MI × 8·NI tile, so one 16-wide k slice is MI + NI/2 ldmatrix.x4 for MI·NI MMAs: shared
    // memory bandwidth, not the MMAs, bounds this kernel unless the warp tile is wide (64 × 64:
    // 8 ldmatrix.x4 of 512 bytes, 32 cycles of an SM's 128 bytes a cycle, for 32 MMAs).
    // K moves in steps of {{ bk }} through a {{ stages }}-stage cp.async ring of swizzled tiles
    // (tile_at in common.cuh), {{ stages }} × ({{ bm }} + {{ bn }}) × {{ bk }} bf16 of dynamic shared
    // memory (held to SM120's 99 KiB), with one barrier a step (mma_mainloop). Blocks walk
    // {{ group }} row tile(s) down before moving right (grouped_tile_of). The output tile is
    // staged in the same shared memory, rotated where rope applies, and leaves as 16-byte
    // row vectors wherever 16 bytes of permuted columns are 16 bytes of consecutive output
    // columns on a 16-byte boundary (every full vector without rope). Rows past `rows` and
    // columns past N are zero-filled on the way in and skipped on the way out; K is a multiple
    // of 8 (16-byte copies).
    // Split K ({{ splits }} way(s), part "{{ part }}"): where the output tiles are too few to fill
    // the GPU (a decode's few rows), the "partial" kernel's blocks each take one of SPLITS
    // consecutive ranges of K steps of one tile (the splits of a tile adjacent, so they read its
    // x rows from L2 together) and store their f32 accumulators to `partials`; the "reduce"
    // kernel after it adds a tile's SPLITS partial sums in split order (so a result never
    // depends on timing) and runs the epilogue. "whole" is one kernel over all of K.
    using T = {{ y_t }};
{%- if part == "whole" %}
    float* const partials = nullptr;  // split kernels only
{%- endif %}
    constexpr int BM = {{ bm }}, BN = {{ bn }}, BK = {{ bk }}, STAGES = {{ stages }}, GROUP = {{ group }};
    constexpr int THREADS = {{ threads }}, WARPS_M = {{ warps_m }}, WARPS_N = {{ warps_n }};
    constexpr int MI = BM / WARPS_M / 16, NI = BN / WARPS_N / 8, CHUNKS = BK / 8;
    static_assert(WARPS_M * WARPS_N * 32 == THREADS, "one warp per warp tile");
    static_assert(MI * 16 * WARPS_M == BM && NI * 8 * WARPS_N == BN && NI % 2 == 0, "whole m16n8 tiles");
    constexpr int X_VECS = BM * CHUNKS / THREADS, W_VECS = BN * CHUNKS / THREADS;
    static_assert(X_VECS * THREADS == BM * CHUNKS && W_VECS * THREADS == BN * CHUNKS, "whole copies");
    // The staged output: rows one 16-byte vector longer than the tile, so the eight rows a
    // warp's pair stores touch start on different banks.
    constexpr int VEC = 16 / sizeof(T), PITCH = BN + VEC;
    static_assert(STAGES * (BM + BN) * BK * 2 <= {{ shared_bytes }} && BM * PITCH * sizeof(T) <= {{ shared_bytes }},
                  "the ring and the staged tile fit the block's shared memory");
    constexpr int N_TILES = (COLS + BN - 1) / BN;
    constexpr int STEPS = (K + BK - 1) / BK;
    constexpr int SPLITS = {{ splits }};
    constexpr bool PARTIAL = {{ part == "partial" }}, REDUCE = {{ part == "reduce" }};
    static_assert(SPLITS >= 1 && SPLITS <= STEPS && (SPLITS > 1) == (PARTIAL || REDUCE),
                  "a split kernel is a partial or a reduce one, of at most a split a K step");
    static_assert(GROUP == 1 || SPLITS == 1, "split tiles are walked one row tile at a time");
    bf16* const sx = reinterpret_cast<bf16*>(dynamic_smem);  // [STAGES][BM × BK]
    bf16* const sw = sx + STAGES * BM * BK;                  // [STAGES][BN × BK]

    // The partial kernel's grid is the tiles' times SPLITS, the splits of a tile adjacent.
    const i64 tile_block = PARTIAL ? blockIdx.x / SPLITS : blockIdx.x;
    const Tile tile = grouped_tile_of(tile_block, N_TILES, BM, rows, GROUP);
    const int nt = tile.nt, h = tile.h;
    const i64 m0 = tile.m0;
    if (m0 >= rows) return;
    const int n0 = nt * BN;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N, g = lane >> 2, t4 = lane & 3;
    float acc[MI][NI][4];
    // A tile's partial sums: accumulator tile q = mi·NI + ni of thread tid in split s is the
    // float4 at (s·MI·NI + q)·THREADS + tid, so a warp stores and loads 512 contiguous bytes.
    float4* const part = reinterpret_cast<float4*>(partials) + tile_block * SPLITS * MI * NI * THREADS + tid;
    if constexpr (REDUCE) {
        zero_tiles(acc);
        for (int s = 0; s < SPLITS; ++s)
#pragma unroll
            for (int q = 0; q < MI * NI; ++q) {
                const float4 p = __ldcg(&part[(s * MI * NI + q) * THREADS]);
                float* const a = acc[q / NI][q % NI];
                a[0] += p.x;
                a[1] += p.y;
                a[2] += p.z;
                a[3] += p.w;
            }
    } else {
        // Vector v = tid + i·THREADS of a tile is row v / CHUNKS, chunk v % CHUNKS: each thread
        // copies X_VECS 16-byte vectors of x and W_VECS of w per stage. Rows without data read
        // nothing and land as zeros.
        const int cc = tid % CHUNKS * 8;
        // A head's weight rows as 32-bit offsets from its first: a register a copy, not two.
        static_assert((long long)N * K < (1ll << 31), "a head's weight addressed in 32 bits");
        const bf16* const wh = w + (i64)h * N * K;
        const bf16* xs[X_VECS];
        int ws[W_VECS];
        bool x_ok[X_VECS], w_ok[W_VECS];
#pragma unroll
        for (int i = 0; i < X_VECS; ++i) {
            const i64 r = m0 + (tid + i * THREADS) / CHUNKS;
            x_ok[i] = r < rows;
            xs[i] = x + (x_ok[i] ? x_offset(r, h, x_outer, x_row, x_inner_rows, x_head) : 0) + cc;
        }
#pragma unroll
        for (int i = 0; i < W_VECS; ++i) {
            const int c = column(n0 + (tid + i * THREADS) / CHUNKS);
            w_ok[i] = c >= 0;
            ws[i] = (w_ok[i] ? c * K : 0) + cc;
        }
        // Copy i lands THREADS / CHUNKS rows (a multiple of 8, where tile_at's swizzle repeats)
        // below copy 0.
        static_assert(THREADS / CHUNKS % 8 == 0, "copies whole swizzle periods apart");
        const int at = tile_at<BK>(tid / CHUNKS, cc);
        // This block's K steps: split s of a partial kernel takes [s·STEPS / SPLITS, (s+1)·STEPS / SPLITS).
        const int split = PARTIAL ? (int)(blockIdx.x % SPLITS) : 0;
        const int first = split * STEPS / SPLITS, steps = (split + 1) * STEPS / SPLITS - first;
        auto load = [&](int stage, int k_step) {
            const int k0 = first * BK + k_step;
            const bool in_k = k0 + cc < K;
#pragma unroll
            for (int i = 0; i < X_VECS; ++i)
                cp_async16(&sx[stage * BM * BK + at + i * (THREADS / CHUNKS) * BK], x_ok[i] && in_k ? xs[i] + k0 : x,
                           x_ok[i] && in_k);
#pragma unroll
            for (int i = 0; i < W_VECS; ++i)
                cp_async16(&sw[stage * BN * BK + at + i * (THREADS / CHUNKS) * BK], w_ok[i] && in_k ? wh + ws[i] + k0 : w,
                           w_ok[i] && in_k);
        };

        // Fragments double buffered where the accumulators, both buffers, the copies' pointers and
        // ~40 registers of indices fit the registers a thread may have at {{ min_blocks }} block(s) an
        // SM (64 × 64 warps with K steps of 64, 16 pointers, spilled 16 bytes on sm_120a).
        constexpr int BUFS =
            MI * NI * 4 + 2 * (MI * 4 + NI * 2) + 2 * (X_VECS + W_VECS) + 40 <= 65536 / ({{ min_blocks }} * THREADS) ? 2 : 1;
        mma_mainloop<BM, BN, BK, STAGES, MI, NI, BUFS>(acc, sx, sw, steps, wm, wn, lane, load);
        if constexpr (PARTIAL) {
            // The reduce kernel reads these after this grid has ended; the copies issued past the
            // last step are empty (commit groups without copies), so nothing is in flight.
#pragma unroll
            for (int q = 0; q < MI * NI; ++q) {
                const float* const a = acc[q / NI][q % NI];
                __stcg(&part[(split * MI * NI + q) * THREADS], make_float4(a[0], a[1], a[2], a[3]));
            }
            return;
        }

        // Every copy has landed (the last real one was waited for in the loop) and, after the
        // barrier, every warp is done reading the ring, which now holds the output tile.
        cp_async_wait<0>();
    }
    __syncthreads();
    T* const sy = reinterpret_cast<T*>(dynamic_smem);  // [BM][PITCH]
    // Only a warp that holds a rotated pair rotates, all its pairs alike: rotate2 has no branch, and
    // the one on `rotates` is taken once around the loops, so the pairs' chains (the angle's
    // reduction, sin and cos) are independent and interleave; a branch a pair serialised them.
    bool rotates = false;
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) rotates = rotates || rotated(n0 + wn * NI * 8 + ni * 8 + t4 * 2);
    rotates = __any_sync(0xffffffffu, rotates);
    // Accumulator e of an 8-column tile is row g + (e / 2) * 8, column t4 * 2 + e % 2.
    auto stage = [&](auto rotate) {
        // A lane's pairs share their frequencies down the rows: read once, not once a row.
        Freq freq[NI];
        if constexpr (rotate.value) {
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) freq[ni] = freq_of(n0 + wn * NI * 8 + ni * 8 + t4 * 2);
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int lr = wm * MI * 16 + mi * 16 + g + half * 8;
                float position = 0.f;
                if constexpr (rotate.value)
                    if (m0 + lr < rows) position = rope_position(positions, m0 + lr, rows_per_position);
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) {
                    const int lc = wn * NI * 8 + ni * 8 + t4 * 2;
                    float v0 = acc[mi][ni][half * 2], v1 = acc[mi][ni][half * 2 + 1];
                    if constexpr (rotate.value) rotate2(freq[ni], v0, v1, position);
                    st2(&sy[lr * PITCH + lc], v0, v1);
                }
            }
    };
    if (rotates)
        stage(Flag<true>{});
    else
        stage(Flag<false>{});
    __syncthreads();
    constexpr int ROW_VECS = BN / VEC;
    // A thread's vectors lie in one column of vectors (THREADS is a multiple of ROW_VECS), so
    // where they go is worked out once, not once a row: with rope, the permuted columns' map (a
    // division and three branches a column) cost the epilogue more than the rotation did
    // (q_b_proj at 4096 rows on an H100: 767 → 665 µs, tests/gpu/results/2026-12-06a).
    static_assert(THREADS % ROW_VECS == 0, "a thread's vectors share their columns");
    const int lc = tid % ROW_VECS * VEC;
    int cols[VEC];
    bool run = true;  // the vector's columns are consecutive output columns
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        cols[j] = column(n0 + lc + j);
        run = run && cols[j] >= 0 && cols[j] == cols[0] + j;
    }
    for (int v = tid; v < BM * ROW_VECS; v += THREADS) {
        const int lr = v / ROW_VECS;
        const i64 r = m0 + lr;
        if (r >= rows) break;
        T* const out = y + r * y_row + h * y_head;
        const T* const in = &sy[lr * PITCH + lc];
        if (run && reinterpret_cast<size_t>(out + cols[0]) % 16 == 0) {
            *reinterpret_cast<uint4*>(out + cols[0]) = *reinterpret_cast<const uint4*>(in);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j)
                if (cols[j] >= 0) out[cols[j]] = in[j];
        }
    }
}
