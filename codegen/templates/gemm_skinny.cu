{%- set argmax = argmax | default(value=false) -%}
{%- set weights_first = true -%}
{% include "gemm_head.cuh" %}
    // Tensor-core GEMM for few rows (decode), where the weight's bytes set the time: each warp
    // computes {{ nt }} 8-column MMA tile(s) of {{ mt }} tile(s) of 16 rows of one head, a block
    // 8 / {{ warps_k }} such column tiles side by side, and the {{ warps_k }} warp(s) of a column
    // tile split K in interleaved 32-wide chunks (split-K inside the block, so even N = 2048 gives
    // 128 blocks; a short K is split less, so that each warp has chunks enough to keep its loads in
    // flight); their partial sums are added in a fixed order through shared memory (8 warps × 4·NT
    // floats per row tile × 32 lanes), so a result never depends on timing. No weight is staged in
    // shared memory: the sum over k does not care which k feeds which fragment slot as long as x
    // and w agree, so lane (g, t4) loads k0 + 8 t4 .. + 7 of its row as one 16-byte vector and
    // feeds two MMAs with it, and one warp-wide load is 8 weight rows × 64 contiguous bytes. Each
    // warp keeps {{ depth }} chunks of weight loads in flight (a ring of registers refilled as each
    // chunk is multiplied): a weight byte is used once, so the kernel runs at the rate loads are in
    // flight. The one-tile variant (at most 16 rows) holds a quarter of the accumulators, so more
    // blocks fit an SM, each warp can keep more loads in flight, and x's fragments are loaded a
    // chunk ahead as well (64 rows of them would cost 32 registers and a block an SM), or `x_ahead`
    // chunks ahead where that is set, or, where `x_rows` is, staged in shared memory after the wait
    // (gemm_x_stage.cuh); one 8-column MMA tile a block gives a narrow weight twice the blocks.
    // Only the row tiles that hold rows run; more rows take more blocks. Every block re-reads x
    // (its rows × K) from L1/L2.
    constexpr int WARPS = {{ threads }} / 32, NT = {{ nt }}, BN = 8 * NT, MT = {{ mt }}, BM = 16 * MT, CHUNK = 32;
    constexpr int WARPS_K = {{ warps_k }}, WARPS_N = WARPS / WARPS_K, BLOCK_N = BN * WARPS_N;
    constexpr int DEPTH = {{ depth }}, PREFETCH = {{ prefetch }};
    constexpr bool X_AHEAD = MT == 1;
    // Chunks of x in flight ahead of the MMAs (X_AHEAD): at one, ptxas issues a warp's x loads
    // in the loop between MMAs that wait for them, each a round trip to L2 on the path from one
    // weight load to the next; at three it issues them beside the ring's weight loads (the SASS
    // of GLM-5's K = 6144 tiles on sm_90a, tests/gpu/README.md, the twenty-third session).
    constexpr int XA = {{ x_ahead | default(value=1) }};
    static_assert(WARPS % WARPS_K == 0, "the warps split into K groups of equal size");
    constexpr int N_TILES = (COLS + BLOCK_N - 1) / BLOCK_N;
    constexpr int CHUNKS = (K + CHUNK - 1) / CHUNK;
    __shared__ float partial[WARPS][MT * NT * 4][32];

    const Tile tile = tile_of(blockIdx.x, N_TILES, BM);
    const int nt = tile.nt, h = tile.h;
    const i64 m0 = tile.m0;
    if (m0 >= rows) return;
    const int mt = (int)min((i64)MT, (rows - m0 + 15) / 16);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    // Warp (wk, wn) takes every WARPS_K-th chunk from chunk wk, of the block's column tile wn.
    const int wk = warp % WARPS_K, wn = warp / WARPS_K;
    const int n0 = nt * BLOCK_N + wn * BN;

    const bf16* xr[MT][2];
    bool xv[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const i64 r = m0 + mi * 16 + g + half * 8;
            xv[mi][half] = r < rows;
            xr[mi][half] = x + (r < rows ? x_offset(r, h, x_outer, x_row, x_inner_rows, x_head) : 0) + t4 * 8;
        }
    const bf16* wr[NT];
    bool wv[NT];
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) {
        const int c = column(n0 + ni * 8 + g);
        wv[ni] = c >= 0;
        wr[ni] = w + (i64)h * N * K + (c >= 0 ? (i64)c * K : 0) + t4 * 8;
    }

    float acc[MT][NT][4];
    zero_tiles(acc);

    const uint4 zero = make_uint4(0, 0, 0, 0);
{%- if x_rows is defined %}
    static_assert(MT == 1, "x is staged for the one-row-tile form");
{% include "gemm_x_stage.cuh" %}
    // Whether this block's rows of x are in xs (set after the wait).
    bool staged = false;
{%- endif %}
    auto fetch = [&](int ch, uint4 (&wq)[NT], auto early) {
        const int k0 = ch * CHUNK;
        const bool in_k = ch < CHUNKS && k0 + t4 * 8 < K;
#pragma unroll
        // The address stays inside the weight also where the load is not wanted, so a load the
        // compiler issues ahead of the condition cannot fault.
        for (int ni = 0; ni < NT; ++ni)
            wq[ni] = wv[ni] && in_k ? ld_weight16<PREFETCH, decltype(early)::value>(wr[ni] + (in_k ? k0 : 0)) : zero;
    };
    // Row tile mi of x's fragments of chunk ch (zero past K and for rows past the last): slots
    // (a0..a3) = (row g, row g + 8) × (first, second k pair) of each half chunk.
    auto load_x = [&](int ch, int mi, uint4 (&xq)[2]) {
{%- if x_rows is defined %}
        if (staged) {
            x_staged(ch, xq);
            return;
        }
{%- endif %}
        const int k0 = ch * CHUNK;
        const bool in_k = ch < CHUNKS && k0 + t4 * 8 < K;
        // As for the weights, the address stays inside x where no load is wanted.
        const int kx = in_k ? k0 : 0;
#pragma unroll
        for (int half = 0; half < 2; ++half)
            xq[half] = xv[mi][half] && in_k ? *reinterpret_cast<const uint4*>(xr[mi][half] + kx) : zero;
    };
    auto mma_chunk = [&](int mi, const uint4 (&xq)[2], const uint4 (&wq)[NT]) {
        const unsigned lo[4] = {xq[0].x, xq[1].x, xq[0].y, xq[1].y};
        const unsigned hi[4] = {xq[0].z, xq[1].z, xq[0].w, xq[1].w};
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) {
            mma_bf16(acc[mi][ni], lo, wq[ni].x, wq[ni].y);
            mma_bf16(acc[mi][ni], hi, wq[ni].z, wq[ni].w);
        }
    };
    // Slot d of the ring holds chunk ch + d·WARPS_K; each warp takes its chunks in ascending order.
    uint4 ring[DEPTH][NT];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) fetch(wk + d * WARPS_K, ring[d], Flag<true>{});
    // Only weights above (see weights_before_wait): x is the kernel before's output.
    grid_dependency_control();
{%- if x_rows is defined %}
    staged = stage_x(m0, h);
{%- endif %}
    uint4 xa[XA][2];
    if constexpr (X_AHEAD)
#pragma unroll
        for (int a = 0; a < XA; ++a) load_x(wk + a * WARPS_K, 0, xa[a]);
    uint4 (&xq)[2] = xa[0];
    for (int ch = wk; ch < CHUNKS; ch += DEPTH * WARPS_K) {
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
            const int c = ch + d * WARPS_K;
            if constexpr (X_AHEAD) {
                // x comes from L2 (every block reads it): loading the warp's next chunk of it
                // before this chunk's MMAs keeps that latency off the path from one weight load
                // to the next.
                uint4 xn[2];
                load_x(c + XA * WARPS_K, 0, xn);
                if (c < CHUNKS) mma_chunk(0, xa[0], ring[d]);
#pragma unroll
                for (int a = 0; a + 1 < XA; ++a) {
                    xa[a][0] = xa[a + 1][0];
                    xa[a][1] = xa[a + 1][1];
                }
                xa[XA - 1][0] = xn[0];
                xa[XA - 1][1] = xn[1];
            } else if (c < CHUNKS) {
#pragma unroll
                for (int mi = 0; mi < MT; ++mi) {
                    if (mi < mt) {
                        load_x(c, mi, xq);
                        mma_chunk(mi, xq, ring[d]);
                    }
                }
            }
            fetch(c + DEPTH * WARPS_K, ring[d], Flag<false>{});
        }
    }

#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) partial[warp][(mi * NT + ni) * 4 + e][lane] = acc[mi][ni][e];
{%- if argmax %}
    // The best key of each of the block's rows over its BLOCK_N columns.
    __shared__ unsigned long long row_best[BM];
    for (int i = tid; i < BM; i += {{ threads }}) row_best[i] = 0ull;
{%- endif %}
    __syncthreads();
    // One unit = one lane's pair of adjacent columns in one row of one tile of one column group,
    // summed over that group's WARPS_K warps.
    for (int u = tid; u < WARPS_N * MT * NT * 2 * 32; u += {{ threads }}) {
        const int l = u & 31, slot = (u >> 5) % (MT * NT * 2), un = (u >> 5) / (MT * NT * 2);
        const int half = slot & 1, tile = slot >> 1, mi = tile / NT, ni = tile % NT;
        const int un0 = nt * BLOCK_N + un * BN;
        const i64 r = m0 + mi * 16 + (l >> 2) + half * 8;
        if (mi >= mt || r >= rows) continue;
        float v0 = 0.f, v1 = 0.f;
#pragma unroll
        for (int j = 0; j < WARPS_K; ++j) {
            v0 += partial[un * WARPS_K + j][tile * 4 + half * 2][l];
            v1 += partial[un * WARPS_K + j][tile * 4 + half * 2 + 1][l];
        }
{%- if argmax %}
        const int c = un0 + ni * 8 + (l & 3) * 2;
        const unsigned long long key = max(argmax_key(v0, column(c)), argmax_key(v1, column(c + 1)));
        if (key != 0ull) atomicMax(&row_best[r - m0], key);
{%- else %}
        store2(y + r * y_row + h * y_head, un0 + ni * 8 + (l & 3) * 2, v0, v1, positions, r, rows_per_position);
{%- endif %}
    }
{%- if argmax %}
    __syncthreads();
    for (int i = tid; i < mt * 16 && m0 + i < rows; i += {{ threads }})
        if (row_best[i] != 0ull) atomicMax(best + m0 + i, row_best[i]);
{%- endif %}
}
