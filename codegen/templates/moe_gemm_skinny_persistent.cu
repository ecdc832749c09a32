// {{ op }} for few rows per expert (decode, and every f32 run), on a persistent grid: routed rows
// [n·k, {{ n }}] = {% if swiglu %}silu(x[t] · gateᵀ) ⊙ (x[t] · upᵀ), t = order[r] / {{ top_k }} (the token of routed row r){% else %}h[r] · downᵀ{% endif %},
// with the weights [E, {{ n }}, {{ k }}] of the expert owning row r, in FP32 FMA for any dtype.
// moe_gemm_skinny.cu's work item (a run of up to ROWS = {{ rows }} rows of one expert × a column
// tile), each warp streaming whole weight rows against the run's rows through L1 and summing
// over its lanes, in the same order, so the results are the same bits. What differs is the grid.
//
// There a block per (routed row, tile) slot found its expert (one round of L2 loads and a
// barrier), then its run's row pointers (another round and a barrier), then streamed only 16
// columns × K (64 KB at moe.down's K = 2048: four DRAM round trips of two steps in flight) and
// exited, and the next block started from nothing: about 3 of every 7 round trips of a block's
// life had no weight load in flight, so an SM averaged about 27 KB in flight against the
// ~32 KB that Little's law asks at the copy bandwidth (4.27 TB/s over 132 SMs is 32 KB/µs an
// SM, ~1 µs of DRAM latency under load). moe.down reached 3.03 TB/s, 71% of the copy bandwidth
// (Nsight Compute, batch 1), and at batch 64 ~57% of its 196608 blocks only found that their row
// starts no run.
//
// Here gridDim.x = SMs × {{ min_blocks }} blocks stay resident. Each builds the run table once
// (runs before each expert, from the offsets: one round of loads and a block scan, after the
// wait, since moe.sort writes the offsets) and then walks items b, b + gridDim.x, … of the
// (run, tile) list in that fixed order, so every output element is summed by one warp in one
// order and no block is empty. The warps of a block share nothing after the table: each keeps
// a ring of DEPTH = {{ depth }} steps of weight loads ({{ warp_cols }} column(s) × gate and up or down,
// 16 bytes a lane each), refilled from the block's next item as soon as this item's last step
// is multiplied, so those loads are in flight while this item is reduced and stored and the
// next item's row pointers are read. In flight an SM: blocks × 8 warps × DEPTH × columns ×
// matrices × 512 B; the shipped moe.down (2 columns, depth 4) and gate_up (1 column of gate
// and up, depth 4) hold 4 KB a warp, 64 KB an SM at two blocks: twice Little's 32 KB, since a
// warp holds only DEPTH − 1 steps while it multiplies and stalls on x. At batch 1 moe.down has
// 8 runs × 384 tiles over 264 blocks (11.6 items a block, 12 the most: the last round 97%
// busy), gate_up 8 runs × 256 tiles (7.8, 8).
// FP32 FMA is no limit at decode: an SM streams ~16.5 weight elements a cycle (32 KB/µs at
// 1.96 GHz) and does m FMAs on each for a run of m rows, against 128 FMA lanes; m averages 2.3
// at batch 64 (512 routed rows over ~220 experts), and only runs of all 8 rows approach it.
extern "C" __global__ void __launch_bounds__({{ threads }}, {{ min_blocks }}) {{ name }}(
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
    constexpr int ROWS = {{ rows }}, V = {{ vec }}, THREADS = {{ threads }}, WARPS = THREADS / 32;
    constexpr int WC = {{ warp_cols }}, COLS = WARPS * WC, TILES = (N + COLS - 1) / COLS;
    constexpr int STEP = 32 * V, STEPS = (K + STEP - 1) / STEP, DEPTH = {{ depth }};
    constexpr int MATS = {% if swiglu %}2{% else %}1{% endif %}, PER = (E + THREADS - 1) / THREADS;
    static_assert(ROWS <= 32, "a lane reads each row pointer of a run");
    using W = Vec<{{ w_t }}, V>;
    // first_run[e]: runs of the experts before e (first_run[E]: all of them); first_row[e]: the
    // expert's first routed row (offsets[e]).
    __shared__ int first_run[E + 1], first_row[E + 1], warp_runs[WARPS];
    __shared__ const {{ x_t }}* xs[WARPS][ROWS];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    // Thread t counts the runs of experts t·PER … t·PER + PER − 1; a scan over the block places
    // them.
    int runs[PER], starts[PER], mine = 0;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int e = tid * PER + j;
        const i64 a = e < E ? offsets[e] : 0, b = e < E ? offsets[e + 1] : 0;
        starts[j] = (int)a;
        runs[j] = (int)((b - a + ROWS - 1) / ROWS);
        mine += runs[j];
    }
    int upto = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, upto, o);
        if (lane >= o) upto += t;
    }
    if (lane == 31) warp_runs[warp] = upto;
    __syncthreads();
    int before = upto - mine;
    for (int w = 0; w < warp; ++w) before += warp_runs[w];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int e = tid * PER + j;
        if (e < E) {
            first_run[e] = before;
            first_row[e] = starts[j];
        }
        before += runs[j];
    }
    // The last thread's running count is every expert's.
    if (tid == THREADS - 1) {
        first_run[E] = before;
        first_row[E] = (int)offsets[E];
    }
    __syncthreads();
    // An int holds the items, and a step past the last (kernels.rs checks at the limits).
    const int items = first_run[E] * TILES;

    // The item being streamed: its expert, first routed row, rows and this warp's first column;
    // `live` false past the last item (then e is still an expert and nothing is loaded).
    int e, row, m, c0;
    bool live;
    auto expert_of = [&](int item) {
        const int run = item / TILES;
        // The last e with first_run[e] <= run (first_run[0] = 0, first_run[E] > run for a live
        // item), from shared memory.
        int lo = 0, hi = E;
        while (hi - lo > 1) {
            const int mid = (lo + hi) >> 1;
            if (first_run[mid] <= run) lo = mid;
            else hi = mid;
        }
        return lo;
    };
    auto locate = [&](int item, int expert) {
        const int run = item / TILES;
        e = expert;
        row = first_row[e] + (run - first_run[e]) * ROWS;
        m = min(ROWS, first_row[e + 1] - row);
        c0 = (item - run * TILES) * COLS + warp * WC;
        live = item < items;
    };
    // The warp's weight rows of the item: column c0 + cc of matrix q at wq[q] + cc·K (the column
    // clamped, so every address stays inside the weights).
    const {{ w_t }}* wq[MATS];
    auto aim = [&]() {
        const i64 at = ((i64)e * N + min(c0, N - 1)) * K + lane * V;
        wq[0] = w0 + at;
{%- if swiglu %}
        wq[1] = w1 + at;
{%- endif %}
    };
    // Step s of the item's weights into a ring slot (nothing past K, the last column or item:
    // the slot then holds values no FMA or store reads).
    auto fetch = [&](int s, W (&slot)[WC][MATS]) {
        const bool in_k = s < STEPS && (K % STEP == 0 || s * STEP + lane * V < K);
#pragma unroll
        for (int cc = 0; cc < WC; ++cc)
#pragma unroll
            for (int q = 0; q < MATS; ++q)
                if (live && in_k && c0 + cc < N)
                    slot[cc][q] = ld_stream<{{ w_t }}, V>(wq[q] + (c0 + cc < N ? cc * K : 0) + (in_k ? s * STEP : 0));
    };
    // The run's rows of x, a pointer each in the warp's own slots (only its lanes read them).
    auto point = [&]() {
        __syncwarp();
        if (lane < m) {
            const i64 r = row + lane;
{%- if swiglu %}
            xs[warp][lane] = x + (order[r] / TOP_K) * x_row;
{%- else %}
            xs[warp][lane] = x + r * x_row;
{%- endif %}
        }
        __syncwarp();
    };
    float acc[WC][MATS][ROWS];
    auto multiply = [&](int s, const W (&slot)[WC][MATS]) {
        const int k = s * STEP + lane * V;
        if (K % STEP != 0 && k >= K) return;
        float wf[WC][MATS][V];
#pragma unroll
        for (int cc = 0; cc < WC; ++cc)
#pragma unroll
            for (int q = 0; q < MATS; ++q)
#pragma unroll
                for (int v = 0; v < V; ++v) wf[cc][q][v] = ld(&slot[cc][q].v[v]);
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            if (i < m) {
                float xv[V];
                ld_vec<{{ x_t }}, V>(xs[warp][i] + k, xv);
#pragma unroll
                for (int cc = 0; cc < WC; ++cc)
#pragma unroll
                    for (int q = 0; q < MATS; ++q)
#pragma unroll
                        for (int v = 0; v < V; ++v) acc[cc][q][i] = fmaf(wf[cc][q][v], xv[v], acc[cc][q][i]);
            }
        }
    };

    int item = blockIdx.x;
    locate(item, expert_of(item));
    aim();
    W ring[DEPTH][WC][MATS];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) fetch(d, ring[d]);
    if (live) point();
    while (live) {
        const int row_now = row, m_now = m, c0_now = c0;
        // The next item's expert, searched while this item's loads are in flight.
        const int next = item + (int)gridDim.x, e_next = expert_of(next);
#pragma unroll
        for (int cc = 0; cc < WC; ++cc)
#pragma unroll
            for (int q = 0; q < MATS; ++q)
#pragma unroll
                for (int i = 0; i < ROWS; ++i) acc[cc][q][i] = 0.f;
        // Slot d holds steps d, d + DEPTH, …; step s's slot is refilled with step s + DEPTH.
#pragma unroll 1
        for (int s0 = 0; s0 < STEPS; s0 += DEPTH) {
#pragma unroll
            for (int d = 0; d < DEPTH; ++d) {
                if (STEPS % DEPTH == 0 || s0 + d < STEPS) multiply(s0 + d, ring[d]);
                fetch(s0 + d + DEPTH, ring[d]);
            }
        }
        // The ring's first turn of the next item, then this item's sums.
        locate(next, e_next);
        aim();
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) fetch(d, ring[d]);
#pragma unroll
        for (int cc = 0; cc < WC; ++cc) {
            if (c0_now + cc >= N) break;
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                if (i >= m_now) break;
                float a = warp_sum(acc[cc][0][i]);
{%- if swiglu %}
                const float b = warp_sum(acc[cc][1][i]);
                a = silu(a) * b;
{%- endif %}
                if (lane == 0) st(y + (i64)(row_now + i) * N + c0_now + cc, a);
            }
        }
        if (live) point();
        item = next;
    }
}
