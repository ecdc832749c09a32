// {{ op }} for many rows per expert (prefill, bf16): routed rows [n·k, {{ n }}] =
// {% if swiglu %}silu(x[t] · gateᵀ) ⊙ (x[t] · upᵀ), t = order[r] / {{ top_k }}{% else %}h[r] · downᵀ{% endif %}, with the weights [E, {{ n }}, {{ k }}] of
// the expert owning row r; bf16 mma.sync m16n8k16 with f32 accumulators, gemm_mma.cu's tiling:
// 128 × 128 block tiles on 8 warps of 32 × 64, K in steps of 32 through a 4-stage cp.async ring
// of swizzled tiles (tile_at in common.cuh), 64 KiB of dynamic shared memory.
// Work items are (expert, 128-row tile of its rows, column tile): the grid has
// ceil(n·k / 128) + E row-tile slots per column tile, the most the experts' tiles can number
// (rounded up to whole column tiles, the extra blocks return at once), and a block finds
// its expert by a warp scan of the per-expert tile counts; slots past the last tile return.
// A-rows are gathered: {% if swiglu %}each routed row reads its token's row of x through `order`{% else %}the routed rows are contiguous{% endif %}; rows past the
// expert's end are zero-filled and not stored.
{%- if swiglu %}
// SwiGLU is fused: the 128 weight rows of a tile alternate 8 gate rows and the same 8 up rows,
// so every thread holds the gate and up accumulators of the same output element, and a block
// computes 64 output columns.
{%- endif %}
extern "C" __global__ void __launch_bounds__(256, 1) {{ name }}(
    {{ y_t }}* __restrict__ y,
    const bf16* __restrict__ x, i64 x_row,
{%- if swiglu %}
    const i64* __restrict__ order,
{%- endif %}
    const i64* __restrict__ offsets,
    const bf16* __restrict__ w0,
{%- if swiglu %}
    const bf16* __restrict__ w1,
{%- endif %}
    i64 tokens)
{
    grid_dependency_control();
    constexpr int K = {{ k }}, N = {{ n }}, E = {{ experts }}, TOP_K = {{ top_k }};
    constexpr int BM = 128, BN = 128, BK = 32, STAGES = 4;
{%- if swiglu %}
    constexpr int OUT_COLS = BN / 2;
{%- else %}
    constexpr int OUT_COLS = BN;
{%- endif %}
    constexpr int N_TILES = (N + OUT_COLS - 1) / OUT_COLS;
    constexpr int STEPS = (K + BK - 1) / BK;
    static_assert(STAGES * (BM + BN) * BK * 2 <= {{ shared_bytes }}, "the ring fits the block's shared memory");
    bf16* const sx = reinterpret_cast<bf16*>(dynamic_smem);  // [STAGES][BM × BK]
    bf16* const sw = sx + STAGES * BM * BK;                  // [STAGES][BN × BK]
    __shared__ int found_e, found_tile;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    // Column tiles outermost; the grid is rounded up to whole column tiles past the slots.
    const i64 slots = (tokens * TOP_K + BM - 1) / BM + E;
    const i64 tile = blockIdx.x % slots;
    if (blockIdx.x / slots >= N_TILES) return;
    const int n0 = (int)(blockIdx.x / slots) * OUT_COLS;
    if (warp == 0) {
        // Lane l looks at experts l, l + 32, …; a warp scan of their tile counts finds the
        // expert whose tiles cover `tile`.
        if (lane == 0) found_e = -1;
        __syncwarp();
        i64 before = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int e = e0 + lane;
            const i64 tiles = e < E ? (offsets[e + 1] - offsets[e] + BM - 1) / BM : 0;
            i64 incl = tiles;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const i64 v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            const i64 first = before + incl - tiles;
            if (tiles > 0 && tile >= first && tile < first + tiles) {
                found_e = e;
                found_tile = (int)(tile - first);
            }
            before += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    __syncthreads();
    const int e = found_e;
    if (e < 0) return;
    const i64 start = offsets[e], end = offsets[e + 1];
    const i64 m0 = start + (i64)found_tile * BM;
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
        x_ok[i] = r < end;
{%- if swiglu %}
        xs[i] = x + (x_ok[i] ? (order[r] / TOP_K) * x_row : 0) + cc;
        // Tile row l: 8-row group l / 8, even groups gate rows, odd groups the same up rows.
        const int l = cr + i * 64, c = n0 + (l / 16) * 8 + l % 8;
        w_ok[i] = c < N;
        ws[i] = (l / 8 % 2 ? w1 : w0) + (i64)e * N * K + (w_ok[i] ? (i64)c * K : 0) + cc;
{%- else %}
        xs[i] = x + (x_ok[i] ? r * x_row : 0) + cc;
        const int c = n0 + cr + i * 64;
        w_ok[i] = c < N;
        ws[i] = w0 + (i64)e * N * K + (w_ok[i] ? (i64)c * K : 0) + cc;
{%- endif %}
    }
    auto load = [&](int stage, int k0) {
        const bool in_k = k0 + cc < K;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int at = tile_at<BK>(cr + i * 64, cc);
            cp_async16(&sx[stage * BM * BK + at], x_ok[i] && in_k ? xs[i] + k0 : x, x_ok[i] && in_k);
            cp_async16(&sw[stage * BN * BK + at], w_ok[i] && in_k ? ws[i] + k0 : w0, w_ok[i] && in_k);
        }
    };

    float acc[2][8][4];
    mma_mainloop<BM, BN, BK, STAGES, 2, 8, 2>(acc, sx, sw, STEPS, wm, wn, lane, load);

    // Accumulator q of an 8-column tile is row g + (q / 2) * 8, column t4 * 2 + q % 2.
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const i64 r = m0 + wm * 32 + mi * 16 + g + half * 8;
            if (r >= end) continue;
{%- if swiglu %}
#pragma unroll
            for (int ni = 0; ni < 8; ni += 2)
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    const int c = n0 + wn * 32 + (ni / 2) * 8 + t4 * 2 + q;
                    if (c < N)
                        st(y + r * N + c, silu(acc[mi][ni][half * 2 + q]) * acc[mi][ni + 1][half * 2 + q]);
                }
{%- else %}
#pragma unroll
            for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    const int c = n0 + wn * 64 + ni * 8 + t4 * 2 + q;
                    if (c < N) st(y + r * N + c, acc[mi][ni][half * 2 + q]);
                }
{%- endif %}
        }
}
