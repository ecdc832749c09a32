{%- set weights_first = true -%}
{% include "gemm_head.cuh" %}
    // gemm_skinny.cu's one-row-tile GEMM (at most 16 rows: a decode's batch) on a persistent
    // grid: as many blocks as the SMs hold (kernels.rs: persistent_blocks), block b computing
    // output tiles b, b + gridDim.x, ... There, a block per tile streams only 8·{{ nt }} × 8 / {{ warps_k }}
    // columns × K of the weight (64 KB for 16 columns at K = 2048), then drains its ring, reduces
    // and exits, and the block after it starts from an empty ring; here the ring is refilled from
    // the block's next tile as soon as a tile's last chunk is multiplied, so those loads are in
    // flight while this tile's partial sums are reduced and stored. Within a tile everything is
    // as in gemm_skinny.cu: warps split K in interleaved 32-wide chunks, {{ depth }} chunks of
    // weight loads in flight per warp, x a chunk ahead, the partial sums added in a fixed order
    // through shared memory.
    constexpr int WARPS = {{ threads }} / 32, NT = {{ nt }}, BN = 8 * NT, BM = 16, CHUNK = 32;
    constexpr int WARPS_K = {{ warps_k }}, WARPS_N = WARPS / WARPS_K, BLOCK_N = BN * WARPS_N;
    constexpr int DEPTH = {{ depth }}, PREFETCH = {{ prefetch }};
    static_assert(WARPS % WARPS_K == 0, "the warps split into K groups of equal size");
    constexpr int N_TILES = (COLS + BLOCK_N - 1) / BLOCK_N;
    constexpr int CHUNKS = (K + CHUNK - 1) / CHUNK;
    __shared__ float partial[WARPS][NT * 4][32];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    // Warp (wk, wn) takes every WARPS_K-th chunk from chunk wk, of the block's column tile wn.
    const int wk = warp % WARPS_K, wn = warp / WARPS_K;
    // The tiles that hold rows (column tile fastest, then head, then row tile); an int holds
    // their count (GLM-5's most: the lm_head's 9680).
    const int tiles = (int)((i64)N_TILES * HEADS * ((rows + BM - 1) / BM));

    // The weight rows the ring is being filled from: this warp's columns of tile t (none past
    // the last tile).
    const bf16* wr[NT];
    bool wv[NT];
    auto weights_of = [&](int t) {
        const Tile at = tile_of(t, N_TILES, BM);
        const int n0 = at.nt * BLOCK_N + wn * BN;
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) {
            const int c = t < tiles ? column(n0 + ni * 8 + g) : -1;
            wv[ni] = c >= 0;
            wr[ni] = w + (i64)at.h * N * K + (c >= 0 ? (i64)c * K : 0) + t4 * 8;
        }
    };
    const uint4 zero = make_uint4(0, 0, 0, 0);
{%- if x_rows is defined %}
{% include "gemm_x_stage.cuh" %}
    // Whether xs holds the current tile's rows of x, and of which row tile and head it holds them
    // (a block's tiles share them wherever there is one head and one row tile: q_b_proj).
    bool staged = false;
    i64 xs_m0 = -1;
    int xs_h = -1;
{%- endif %}
    auto fetch = [&](int ch, uint4 (&wq)[NT], auto early) {
        const int k0 = ch * CHUNK;
        // Where K is whole chunks the lane's k offset is not compared (nor kept in a register).
        const bool in_k = ch < CHUNKS && (K % CHUNK == 0 || k0 + t4 * 8 < K);
#pragma unroll
        // The address stays inside the weight also where the load is not wanted, so a load the
        // compiler issues ahead of the condition cannot fault.
        for (int ni = 0; ni < NT; ++ni)
            wq[ni] = wv[ni] && in_k ? ld_weight16<PREFETCH, decltype(early)::value>(wr[ni] + (in_k ? k0 : 0)) : zero;
    };
    const bf16* xr[2];
    bool xv[2];
    // x's fragments of chunk ch (zero past K and for rows past the last): slots (a0..a3) =
    // (row g, row g + 8) × (first, second k pair) of each half chunk.
    auto load_x = [&](int ch, uint4 (&xq)[2]) {
{%- if x_rows is defined %}
        if (staged) {
            x_staged(ch, xq);
            return;
        }
{%- endif %}
        const int k0 = ch * CHUNK;
        const bool in_k = ch < CHUNKS && (K % CHUNK == 0 || k0 + t4 * 8 < K);
        // As for the weights, the address stays inside x where no load is wanted.
        const int kx = in_k ? k0 : 0;
#pragma unroll
        for (int half = 0; half < 2; ++half)
            xq[half] = xv[half] && in_k ? *reinterpret_cast<const uint4*>(xr[half] + kx) : zero;
    };
    float acc[NT][4];
    auto mma_chunk = [&](const uint4 (&xq)[2], const uint4 (&wq)[NT]) {
        const unsigned lo[4] = {xq[0].x, xq[1].x, xq[0].y, xq[1].y};
        const unsigned hi[4] = {xq[0].z, xq[1].z, xq[0].w, xq[1].w};
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) {
            mma_bf16(acc[ni], lo, wq[ni].x, wq[ni].y);
            mma_bf16(acc[ni], hi, wq[ni].z, wq[ni].w);
        }
    };

    // Slot d of the ring holds chunk ch + d·WARPS_K of a turn from chunk ch; each warp takes its
    // chunks in ascending order.
    int t = blockIdx.x;
    weights_of(t);
    uint4 ring[DEPTH][NT];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) fetch(wk + d * WARPS_K, ring[d], Flag<true>{});
    // Only weights above (see weights_before_wait): x is the kernel before's output.
    grid_dependency_control();
    for (; t < tiles; t += gridDim.x) {
        const Tile cur = tile_of(t, N_TILES, BM);
{%- if x_rows is defined %}
        // The tile before was multiplied by every warp (the barrier before its partial sums).
        if (cur.m0 != xs_m0 || cur.h != xs_h) {
            staged = stage_x(cur.m0, cur.h);
            xs_m0 = cur.m0;
            xs_h = cur.h;
        }
{%- endif %}
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const i64 r = cur.m0 + g + half * 8;
            xv[half] = r < rows;
            xr[half] = x + (r < rows ? x_offset(r, cur.h, x_outer, x_row, x_inner_rows, x_head) + t4 * 8 : 0);
        }
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[ni][e] = 0.f;
        uint4 xq[2];
        load_x(wk, xq);
        for (int ch = wk; ch < CHUNKS; ch += DEPTH * WARPS_K) {
#pragma unroll
            for (int d = 0; d < DEPTH; ++d) {
                const int c = ch + d * WARPS_K;
                // x comes from L2 (every block reads it): loading the warp's next chunk of it
                // before this chunk's MMAs keeps that latency off the path from one weight
                // load to the next.
                uint4 xn[2];
                load_x(c + WARPS_K, xn);
                if (c < CHUNKS) mma_chunk(xq, ring[d]);
                xq[0] = xn[0];
                xq[1] = xn[1];
                fetch(c + DEPTH * WARPS_K, ring[d], Flag<false>{});
            }
        }
        // The ring's first turn of the block's next tile (none past the last: nothing loads).
        weights_of(t + (int)gridDim.x);
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) fetch(wk + d * WARPS_K, ring[d], Flag<false>{});

        // Every thread has read the previous tile's partial sums.
        __syncthreads();
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) partial[warp][ni * 4 + e][lane] = acc[ni][e];
        __syncthreads();
        // One unit = one lane's pair of adjacent columns in one row of one tile of one column
        // group, summed over that group's WARPS_K warps.
        for (int u = tid; u < WARPS_N * NT * 2 * 32; u += {{ threads }}) {
            const int l = u & 31, slot = (u >> 5) % (NT * 2), un = (u >> 5) / (NT * 2);
            const int half = slot & 1, ni = slot >> 1;
            const int un0 = cur.nt * BLOCK_N + un * BN;
            const i64 r = cur.m0 + (l >> 2) + half * 8;
            if (r >= rows) continue;
            float v0 = 0.f, v1 = 0.f;
#pragma unroll
            for (int j = 0; j < WARPS_K; ++j) {
                v0 += partial[un * WARPS_K + j][ni * 4 + half * 2][l];
                v1 += partial[un * WARPS_K + j][ni * 4 + half * 2 + 1][l];
            }
            store2(y + r * y_row + cur.h * y_head, un0 + ni * 8 + (l & 3) * 2, v0, v1, positions, r, rows_per_position);
        }
    }
}
