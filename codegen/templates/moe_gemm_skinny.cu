// {{ op }} for few rows per expert (decode, and every f32 run): routed rows [n·k, {{ n }}] =
// {% if swiglu %}silu(x[t] · gateᵀ) ⊙ (x[t] · upᵀ), t = order[r] / {{ top_k }} (the token of routed row r){% else %}h[r] · downᵀ{% endif %},
// with the weights [E, {{ n }}, {{ k }}] of the expert owning row r, in FP32 FMA for any dtype.
// A work item is (a run of up to ROWS = {{ rows }} rows of one expert, 16 columns): the grid has
// one slot per routed row and column tile, and a slot works only if its row starts a run
// (found from the offsets), so an expert without rows costs nothing and the
// grid does not grow with the expert count. 8 warps × 2 columns: a warp streams its two columns'
// weight rows once, together ({% if swiglu %}gate and up, {% endif %}{{ vec }} elements per lane per 16-byte load) against all
// of the run's rows, which it reads through L1 (every warp of the block reads the same rows),
// then sums over its lanes. At decode an expert has at most ROWS rows, so its weights are read
// once; more rows take more runs, each reading the weights again (through L2). No shared
// memory beyond the run's row pointers.
extern "C" __global__ void __launch_bounds__(256) {{ name }}(
    {{ y_t }}* __restrict__ y,
    const {{ x_t }}* __restrict__ x, i64 x_row,
{%- if swiglu %}
    const i64* __restrict__ order,
{%- endif %}
    const i64* __restrict__ offsets,
    const {{ w_t }}* __restrict__ w0,
{%- if swiglu %}
    const {{ w_t }}* __restrict__ w1,
{%- endif %}
    i64 tokens)
{
    grid_dependency_control();
    constexpr int K = {{ k }}, N = {{ n }}, E = {{ experts }}, TOP_K = {{ top_k }};
    constexpr int ROWS = {{ rows }}, V = {{ vec }}, COLS = 16, TILES = (N + COLS - 1) / COLS;
    __shared__ const {{ x_t }}* xs[ROWS];
    const i64 slot = blockIdx.x / TILES;
    const int n0 = (int)(blockIdx.x % TILES) * COLS;
    // The expert owning row `slot`: the last e with offsets[e] <= slot, i.e. (offsets being
    // sorted, offsets[0] = 0) the count of e in 1..E-1 with offsets[e] <= slot, which the block's
    // threads take together: one round of loads from L2, where a binary search made log2(E)
    // dependent round trips (8 for 256 experts) before a block could load its first weight,
    // which at decode it then streams for only 16 columns × K (moe.down: 64 KB).
    int lo = 0;
    for (int e0 = 0; e0 < E; e0 += {{ threads }}) {
        const int e = e0 + (int)threadIdx.x;
        lo += __syncthreads_count(e >= 1 && e < E && offsets[e] <= slot);
    }
    const i64 start = offsets[lo], end = offsets[lo + 1];
    if (slot >= end || (slot - start) % ROWS != 0) return;
    const int m = (int)min((i64)ROWS, end - slot);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid < m) {
        const i64 r = slot + tid;
{%- if swiglu %}
        xs[tid] = x + (order[r] / TOP_K) * x_row;
{%- else %}
        xs[tid] = x + r * x_row;
{%- endif %}
    }
    __syncthreads();
    const {{ w_t }}* we0 = w0 + (i64)lo * N * K;
{%- if swiglu %}
    const {{ w_t }}* we1 = w1 + (i64)lo * N * K;
    constexpr int MATS = 2;
{%- else %}
    constexpr int MATS = 1;
{%- endif %}
    // A warp's two columns are streamed together: two independent loads per step (four for gate
    // and up) keep more bytes in flight than one column after the other did (moe.down, with one
    // load a step, reached 38% of the copy roofline on an H200 at decode, gate/up 77%). Each
    // column's sum is taken in the same order as before, lane by lane, then over the warp.
    const int c0 = n0 + warp * 2;
    if (c0 >= N) return;
    const bool two = c0 + 1 < N;
    float acc[2][MATS][ROWS];
#pragma unroll
    for (int cc = 0; cc < 2; ++cc)
#pragma unroll
        for (int q = 0; q < MATS; ++q)
#pragma unroll
            for (int i = 0; i < ROWS; ++i) acc[cc][q][i] = 0.f;
#pragma unroll 2
    for (int k0 = lane * V; k0 < K; k0 += 32 * V) {
        float wv[2][MATS][V];
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
            const i64 at = (i64)(two ? c0 + cc : c0) * K + k0;
            ld_vec<{{ w_t }}, V>(we0 + at, wv[cc][0]);
{%- if swiglu %}
            ld_vec<{{ w_t }}, V>(we1 + at, wv[cc][1]);
{%- endif %}
        }
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            if (i < m) {
                float xv[V];
                ld_vec<{{ x_t }}, V>(xs[i] + k0, xv);
#pragma unroll
                for (int cc = 0; cc < 2; ++cc)
#pragma unroll
                    for (int q = 0; q < MATS; ++q)
#pragma unroll
                        for (int v = 0; v < V; ++v) acc[cc][q][i] = fmaf(wv[cc][q][v], xv[v], acc[cc][q][i]);
            }
        }
    }
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
        if (cc == 1 && !two) break;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            if (i >= m) break;
            float a = warp_sum(acc[cc][0][i]);
{%- if swiglu %}
            const float b = warp_sum(acc[cc][1][i]);
            a = silu(a) * b;
{%- endif %}
            if (lane == 0) st(y + (slot + i) * N + c0 + cc, a);
        }
    }
}
