{%- set argmax = argmax | default(value=false) -%}
{% include "gemm_head.cuh" %}
    // SIMT GEMM for few rows, any dtype, f32 FMA: decode in the f32 validation mode, and the f32
    // router, whose handful of rows would leave the 64 × 64 tiles of the baseline idle (it ran
    // 256 × 6144 for one row in 400 us). Each warp computes two adjacent (permuted) columns, so a
    // rope pair stays in one thread, for up to 8 rows; 8 warps a block make 16 columns, and more
    // rows take more blocks. Lanes split K in vectors of {{ vec }} elements, so a warp streams
    // each weight row once per 8 rows; the 16 sums are reduced across the warp at the end, and
    // lane r stores row r. With SPLIT > 1 (a narrow weight, whose few 16-column blocks would
    // leave most SMs idle while each warp walks all of K: the f32 router's 256 × 6144 took 21 us
    // for one row on an H200), SPLIT warps share a column pair, each taking every SPLIT-th
    // 32-vector stretch of K, and their sums are added in warp order through shared memory.
    constexpr int WARPS = {{ threads }} / 32, SPLIT = {{ split }}, BN = 2 * WARPS / SPLIT, RB = 8, V = {{ vec }};
    constexpr int N_TILES = (COLS + BN - 1) / BN;

    const Tile tile = tile_of(blockIdx.x, N_TILES, RB);
    const int nt = tile.nt, h = tile.h;
    const i64 m0 = tile.m0;
    if (m0 >= rows) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % SPLIT;
    const int l0 = nt * BN + warp / SPLIT * 2;
    const int c0 = column(l0), c1 = column(l0 + 1);
{%- if argmax %}
    // The best key of each of the block's rows over its BN columns. A warp past the last column
    // still runs (on zeros, its keys dropped), since every thread meets the barriers below.
    __shared__ unsigned long long row_best[RB];
    if (threadIdx.x < RB) row_best[threadIdx.x] = 0ull;
    __syncthreads();
{%- else %}
    // A split pair's warps meet at a barrier below, so they run past the last column on zeros.
    if (SPLIT == 1 && c0 < 0 && c1 < 0) return;
{%- endif %}
    const {{ w_t }}* w0 = w + (i64)h * N * K + (c0 >= 0 ? (i64)c0 * K : 0);
    const {{ w_t }}* w1 = w + (i64)h * N * K + (c1 >= 0 ? (i64)c1 * K : 0);
    const int nr = (int)min((i64)RB, rows - m0);
    const {{ x_t }}* xr[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r)
        xr[r] = x + (r < nr ? x_offset(m0 + r, h, x_outer, x_row, x_inner_rows, x_head) : 0);

    float acc[RB][2];
#pragma unroll
    for (int r = 0; r < RB; ++r) acc[r][0] = acc[r][1] = 0.f;
#pragma unroll 2
    for (int k = (part * 32 + lane) * V; k < K; k += 32 * V * SPLIT) {
        float a0[V], a1[V];
        if (c0 >= 0) {
            ld_vec<{{ w_t }}, V>(w0 + k, a0);
        } else {
#pragma unroll
            for (int v = 0; v < V; ++v) a0[v] = 0.f;
        }
        if (c1 >= 0) {
            ld_vec<{{ w_t }}, V>(w1 + k, a1);
        } else {
#pragma unroll
            for (int v = 0; v < V; ++v) a1[v] = 0.f;
        }
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            if (r < nr) {
                float xv[V];
                ld_vec<{{ x_t }}, V>(xr[r] + k, xv);
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    acc[r][0] = fmaf(xv[v], a0[v], acc[r][0]);
                    acc[r][1] = fmaf(xv[v], a1[v], acc[r][1]);
                }
            }
        }
    }
    // Every lane gets every sum; lane r stores row r.
    float v0 = 0.f, v1 = 0.f;
#pragma unroll
    for (int r = 0; r < RB; ++r) {
        const float s0 = warp_sum(acc[r][0]), s1 = warp_sum(acc[r][1]);
        if (lane == r) {
            v0 = s0;
            v1 = s1;
        }
    }
    if (SPLIT > 1) {
        __shared__ float part_sums[WARPS][RB][2];
        if (lane < RB) {
            part_sums[warp][lane][0] = v0;
            part_sums[warp][lane][1] = v1;
        }
        __syncthreads();
        v0 = v1 = 0.f;
        if (lane < RB)
            for (int q = warp - part; q < warp - part + SPLIT; ++q) {
                v0 += part_sums[q][lane][0];
                v1 += part_sums[q][lane][1];
            }
    }
    // The pair's first warp stores (every warp where SPLIT is 1).
    const bool stores = part == 0 && (c0 >= 0 || c1 >= 0);
{%- if argmax %}
    if (stores && lane < nr) {
        const unsigned long long key = max(argmax_key(v0, c0), argmax_key(v1, c1));
        if (key != 0ull) atomicMax(&row_best[lane], key);
    }
    __syncthreads();
    if (threadIdx.x < nr && row_best[threadIdx.x] != 0ull) atomicMax(best + m0 + threadIdx.x, row_best[threadIdx.x]);
{%- else %}
    if (stores && lane < nr)
        store2(y + (m0 + lane) * y_row + h * y_head, l0, v0, v1, positions, m0 + lane, rows_per_position);
{%- endif %}
}
