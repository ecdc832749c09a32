// moe.sort: counting sort of the {{ top_k }}-slot pairs of every token by expert ({{ experts }} experts), stable
// (lowest pair index first within an expert), so every run gives the same routed rows. One block
// of 1024 threads, since n·k is at most a few ten thousand pairs: chunks of 1024 pairs, each
// warp ranking its lanes' pairs per expert with __match_any_sync, a per-expert walk over the 32
// warps turning warp counts into ranks, then a warp scan of the counts into offsets and a second
// sweep that adds each pair's expert offset. Shared memory: 32 × {{ experts }} warp counts and
// {{ experts }} + 1 totals, {{ shared }} bytes (static, under 48 KiB). A pair whose id is not an
// expert gets position −1 and no routed row, which `moe.combine` turns into NaN.
extern "C" __global__ void __launch_bounds__(1024, 1) {{ name }}(
    i64* __restrict__ offsets, i64* __restrict__ order, i64* __restrict__ position,
    const i64* __restrict__ ids, i64 ids_row, i64 rows)
{
    grid_dependency_control();
    constexpr int E = {{ experts }}, K = {{ top_k }};
    __shared__ int counts[32][E];
    __shared__ int total[E + 1];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const i64 pairs = rows * K;
    for (int e = tid; e < E; e += 1024) total[e] = 0;
    for (i64 base = 0; base < pairs; base += 1024) {
        for (int i = tid; i < 32 * E; i += 1024) counts[i / E][i % E] = 0;
        __syncthreads();
        const i64 p = base + tid;
        const i64 e = p < pairs ? ids[(p / K) * ids_row + p % K] : -1;
        const bool ok = e >= 0 && e < E;
        const unsigned same = __match_any_sync(0xffffffffu, ok ? e : -1);
        const int rank = __popc(same & ((1u << lane) - 1));
        if (ok && rank == 0) counts[warp][e] = __popc(same);
        __syncthreads();
        for (int x = tid; x < E; x += 1024) {
            int run = total[x];
            for (int w = 0; w < 32; ++w) {
                const int c = counts[w][x];
                counts[w][x] = run;
                run += c;
            }
            total[x] = run;
        }
        __syncthreads();
        if (p < pairs) position[p] = ok ? counts[warp][e] + rank : -1;
        __syncthreads();
    }
    if (warp == 0) {
        // Lane l scans experts [l·C, (l+1)·C), then the lanes' sums are scanned across the warp.
        constexpr int C = (E + 31) / 32;
        int sum = 0;
        for (int i = 0; i < C; ++i) sum += lane * C + i < E ? total[lane * C + i] : 0;
        int incl = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        int run = incl - sum;
        for (int i = 0; i < C; ++i) {
            const int x = lane * C + i;
            if (x < E) {
                const int c = total[x];
                total[x] = run;
                run += c;
            }
        }
        if (lane == 31) total[E] = incl;
    }
    __syncthreads();
    for (int x = tid; x <= E; x += 1024) offsets[x] = total[x];
    // The same thread wrote position[p] above: each sweep hands pair p to thread p % 1024.
    for (i64 p = tid; p < pairs; p += 1024) {
        const i64 e = ids[(p / K) * ids_row + p % K];
        if (e < 0 || e >= E) continue;
        const i64 r = total[e] + position[p];
        position[p] = r;
        order[r] = p;
    }
}
