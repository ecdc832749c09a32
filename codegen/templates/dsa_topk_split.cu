// dsa.topk for a few rows (a small decode batch), the {{ stage }} launch of two: the {{ k }} best
// keys of each row exactly as dsa_topk.cu defines and writes them (higher score, then lower
// index; −0 as +0, NaN as −∞; key order, −1 padded; a row of at most {{ k }} keys gets them all),
// by {{ parts }} blocks of 512 threads a row instead of one block.
//
// Why: one block a row is one SM's dependent chain. Nsight Compute of the one-block kernel on one
// 8k row (H200): ~39k warp instructions on one SM at 16 cycles each per warp, 20k cycles (10 µs),
// the rest of the GPU idle. Here a row of n keys is cut into parts of len = slots · 512 keys (the
// fewest slots, at most {{ slots }}, that {{ parts }} parts need): each block holds its part in
// registers (`slots` keys a thread, 1 for an 8k row, 4 for a 32k one), so the per-key work (bin,
// histogram, scatter, ballots) is n / {{ parts }} keys an SM; what is left is a chain of L2 round trips
// (~0.3 to 0.6 µs each), counted below.
//
// 1. bounds (this file, stage "bounds"): each part's least and greatest score (as order-keys),
//    and the row's counters and histograms of the scratch cleared (the scratch is arena memory
//    other steps reuse, so it is garbage at entry; the kernel boundary is what orders the clear
//    before the second launch's atomics). One DRAM round trip.
// 2. select (stage "select"), per block:
//    a. its part again (L2) and every part's bounds (each warp reduces them itself: no barrier);
//       the 1024-bin histogram linear in the score between the row's least and greatest, as in
//       dsa_topk.cu (same arithmetic, so every block bins every key alike);
//    b. the part's bins scanned from the top: above[b] = its keys in bins above b, stored for the
//       other blocks; the counts added into the row's histogram (global atomics); and the part's
//       keys scattered into its own region of the scratch grouped by bin, best bin first, so that
//       the keys of any bin of any part are one contiguous run at a known place;
//    c. one barrier over the row's blocks (below);
//    d. the row's histogram scanned (each block alike): the cut bin, and want = how many of the k
//       it still has to give;
//    e. where the cut bin holds at most 256 keys: every warp reads the parts' above[cut] and
//       counts (two loads a lane), then the cut bin's keys of every part (one round trip), and
//       the block ranks them (≤ 64 comparisons a thread): the k-th best value T and how many keys
//       equal to T make the cut (`ties`). Where more (a run of equal scores, an outlier
//       stretching the range): radix passes over the order-keys between the cut bin's least and
//       greatest as in dsa_topk.cu, each a barrier over the row (at most 4 passes), then one more
//       barrier for each part's count of keys above and equal to T;
//    f. the part's winners written straight to their ranks: a key's rank is the keys above T
//       before it plus min(keys equal to T before it, ties); the parts before this one give
//       `above` and `equal` (from the parts' above[cut] and the ranked candidates of the parts
//       before, or the counts of e's fallback), the part's own keys one ballot-and-scan as in
//       dsa_topk.cu.
// The common path's chain: launch 1's DRAM load; launch 2's L2 load, histogram, barrier, the
// row's histogram, the counts, the candidates: six L2 round trips and about 8 block barriers,
// against about 10 block barriers and 8 slots a thread of dependent work in one block before.
//
// The barrier: each block's thread 0, after a __syncthreads and a __threadfence (the pattern of
// cooperative groups' grid sync), adds one to the row's counter and spins until it reaches the
// barrier's index times the row's parts. A block only ever waits for blocks of its own grid,
// so all of them must be resident at once: the lowering takes this path for at most
// 128 / {{ parts }} rows, {{ parts }} blocks a row, and a block of 512 threads holds at most 64
// registers a thread (__launch_bounds__(512, 2)), so the grid needs at most 64 of the GPU's SMs
// (H200: 132, RTX PRO 6000: 188). Where the runtime launches kernels early, the next one may be
// scheduled only after every block of this one has started (grid_dependency_control), so it
// cannot take the SMs a waiting block needs.
constexpr int {{ name }}_THREADS = 512;
constexpr int {{ name }}_WARPS = {{ name }}_THREADS / 32;
constexpr int {{ name }}_BINS = 1024;
constexpr int {{ name }}_PARTS = {{ parts }};
constexpr int {{ name }}_SLOTS = {{ slots }};
// A row's words of the scratch: [0] the barrier's arrivals, [1] and [2] the cut bin's least and
// greatest order-key (the fallback); the row's histogram; one histogram a radix pass; then
// each part's bounds (launch 1), its counts above and equal to T (the fallback), its above[]
// and its keys grouped by bin. The first CLEARED words are cleared by launch 1.
constexpr int {{ name }}_HIST = 32;
constexpr int {{ name }}_PASS = {{ name }}_HIST + {{ name }}_BINS;
constexpr int {{ name }}_CLEARED = {{ name }}_PASS + 4 * {{ name }}_BINS;
constexpr int {{ name }}_BOUNDS = {{ name }}_CLEARED;
constexpr int {{ name }}_COUNTS = {{ name }}_BOUNDS + (2 * {{ name }}_PARTS + 31) / 32 * 32;
constexpr int {{ name }}_ABOVE = {{ name }}_COUNTS + (2 * {{ name }}_PARTS + 31) / 32 * 32;
constexpr int {{ name }}_KEYS = {{ name }}_ABOVE + {{ name }}_PARTS * {{ name }}_BINS;
constexpr i64 {{ name }}_ROW = {{ name }}_KEYS + (i64){{ name }}_PARTS * {{ name }}_SLOTS * {{ name }}_THREADS;
static_assert({{ name }}_ROW == {{ row_words }}, "the lowering sizes the scratch by this layout");
// Every warp handles the parts as the lanes of one warp.
static_assert({{ name }}_PARTS <= 32, "at most 32 parts");

{% include "dsa_topk_keys.cuh" %}
// A row's parts: `slots` keys a thread, len = slots · 512 keys a part, `parts` of them (the last
// may be short). The lowering bounds the context by {{ parts }} · {{ slots }} · 512 keys.
struct {{ name }}_Parts {
    int n, slots, len, parts;
};

__device__ __forceinline__ {{ name }}_Parts {{ name }}_parts(int n) {
    constexpr int SPAN = {{ name }}_PARTS * {{ name }}_THREADS;
    const int slots = (n + SPAN - 1) / SPAN;
    const int len = slots * {{ name }}_THREADS;
    return { n, slots, len, (n + len - 1) / len };
}
{% if stage == "bounds" %}
extern "C" __global__ void __launch_bounds__(512) {{ name }}(
    unsigned* __restrict__ scratch, const float* __restrict__ scores, i64 scores_row,
    const i64* __restrict__ positions, i64 rows)
{
    grid_dependency_control();
    constexpr int THREADS = {{ name }}_THREADS, WARPS = {{ name }}_WARPS, SLOTS = {{ name }}_SLOTS;
    __shared__ unsigned lows[WARPS], highs[WARPS];
    const i64 row = blockIdx.x / {{ name }}_PARTS;
    const int part = blockIdx.x % {{ name }}_PARTS, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (row >= rows) return;
    const i64 valid = positions[row] + 1;
    if (valid <= {{ k }}) return;
    const {{ name }}_Parts p = {{ name }}_parts((int)valid);
    if (part >= p.parts) return;
    unsigned* const w = scratch + row * {{ name }}_ROW;
    for (int i = part * THREADS + tid; i < {{ name }}_CLEARED; i += p.parts * THREADS)
        w[i] = i == 1 ? ~0u : 0u;
    const int first = part * p.len, here = min(p.len, p.n - first);
    const float* const s = scores + row * scores_row + first;
    float x[SLOTS];
#pragma unroll
    for (int v = 0; v < SLOTS; ++v) {
        const int j = v * THREADS + tid;
        x[v] = j < here ? {{ name }}_canon(s[j]) : 0.f;
    }
    unsigned lo = ~0u, hi = 0u;
#pragma unroll
    for (int v = 0; v < SLOTS; ++v) {
        if (v * THREADS + tid < here) {
            const unsigned u = {{ name }}_order(x[v]);
            lo = min(lo, u);
            hi = max(hi, u);
        }
    }
    lo = __reduce_min_sync(0xffffffffu, lo);
    hi = __reduce_max_sync(0xffffffffu, hi);
    if (lane == 0) {
        lows[warp] = lo;
        highs[warp] = hi;
    }
    __syncthreads();
    if (warp == 0) {
        lo = __reduce_min_sync(0xffffffffu, lane < WARPS ? lows[lane] : ~0u);
        hi = __reduce_max_sync(0xffffffffu, lane < WARPS ? highs[lane] : 0u);
        if (lane == 0) {
            w[{{ name }}_BOUNDS + 2 * part] = lo;
            w[{{ name }}_BOUNDS + 2 * part + 1] = hi;
        }
    }
}
{% else %}
// Of the row-wide hist[0 .. bins) in global memory (bins ≤ 1024, a higher bin holding better
// values, want ≤ their sum), the bin of the want-th best value: sel = {bin, values in better
// bins, values in the bin}, seen by all. Thread t takes bins bins − 1 − 2t and bins − 2 − 2t.
__device__ __forceinline__ void {{ name }}_pick(
    const unsigned* hist, int bins, unsigned want, unsigned* sums, unsigned* sel)
{
    const int b0 = bins - 1 - 2 * (int)threadIdx.x, b1 = b0 - 1;
    const unsigned h0 = b0 >= 0 ? __ldcg(hist + b0) : 0u;
    const unsigned h1 = b1 >= 0 ? __ldcg(hist + b1) : 0u;
    unsigned total;
    const unsigned better = {{ name }}_scan(h0 + h1, sums, total);
    if (better < want && better + h0 >= want) {
        sel[0] = b0;
        sel[1] = better;
        sel[2] = h0;
    } else if (better + h0 < want && better + h0 + h1 >= want) {
        sel[0] = b1;
        sel[1] = better + h0;
        sel[2] = h1;
    }
    __syncthreads();
}

// The barrier over the row's blocks: returns once `target` arrivals have been counted, and every
// write any of them made before arriving is visible to this block (read it with __ldcg: L2).
__device__ __forceinline__ void {{ name }}_arrive(unsigned* counter, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(512, 2) {{ name }}(
    i64* __restrict__ out, i64 out_row, unsigned* __restrict__ scratch,
    const float* __restrict__ scores, i64 scores_row,
    const i64* __restrict__ positions, i64 rows)
{
    grid_dependency_control();
    constexpr int K = {{ k }}, THREADS = {{ name }}_THREADS, WARPS = {{ name }}_WARPS;
    constexpr int BINS = {{ name }}_BINS, SLOTS = {{ name }}_SLOTS, RANKED = 256;
    __shared__ unsigned hist[BINS];
    __shared__ unsigned cand[RANKED];
    __shared__ unsigned counts[SLOTS * WARPS];
    __shared__ unsigned sums[32];
    __shared__ unsigned sel[3];
    const i64 row = blockIdx.x / {{ name }}_PARTS;
    const int part = blockIdx.x % {{ name }}_PARTS, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (row >= rows) return;
    const i64 valid = positions[row] + 1;
    i64* const o = out + row * out_row;
    if (valid <= K) {
        for (int i = part * THREADS + tid; i < K; i += {{ name }}_PARTS * THREADS) o[i] = i < valid ? i : -1;
        return;
    }
    const {{ name }}_Parts p = {{ name }}_parts((int)valid);
    if (part >= p.parts) return;
    unsigned* const w = scratch + row * {{ name }}_ROW;
    const int first = part * p.len, here = min(p.len, p.n - first);

    // a. The part in registers; the row's least and greatest score from the parts' bounds.
    float x[SLOTS];
    {
        const float* const s = scores + row * scores_row + first;
#pragma unroll
        for (int v = 0; v < SLOTS; ++v) {
            const int j = v * THREADS + tid;
            x[v] = j < here ? {{ name }}_canon(s[j]) : 0.f;
        }
    }
    const auto in = [&](int v) { return v * THREADS + tid < here; };
    unsigned lo_u = lane < p.parts ? __ldcg(w + {{ name }}_BOUNDS + 2 * lane) : ~0u;
    unsigned hi_u = lane < p.parts ? __ldcg(w + {{ name }}_BOUNDS + 2 * lane + 1) : 0u;
    lo_u = __reduce_min_sync(0xffffffffu, lo_u);
    hi_u = __reduce_max_sync(0xffffffffu, hi_u);
    hist[tid] = 0u;
    hist[tid + THREADS] = 0u;
    __syncthreads();
    const float lo = {{ name }}_value(lo_u), span = __fsub_rn({{ name }}_value(hi_u), lo);
    const float scale = __fdiv_rn((float)BINS, span);
    const bool linear = span > 0.f && isfinite(span) && isfinite(scale);
    const auto bin = [=](float f) -> unsigned {
        return linear ? min((unsigned)BINS - 1u, __float2uint_rz(__fmul_rn(__fsub_rn(f, lo), scale)))
                      : {{ name }}_order(f) >> 22;
    };
#pragma unroll
    for (int v = 0; v < SLOTS; ++v)
        if (in(v)) atomicAdd(&hist[bin(x[v])], 1u);
    __syncthreads();

    // b. above[b] from the top (thread t's bins are 1023 − 2t and 1022 − 2t), the row's
    // histogram, and the part's keys grouped by bin (hist becomes each bin's next free place).
    {
        const int b0 = BINS - 1 - 2 * tid, b1 = b0 - 1;
        const unsigned h0 = hist[b0], h1 = hist[b1];
        unsigned total;
        const unsigned a0 = {{ name }}_scan(h0 + h1, sums, total), a1 = a0 + h0;
        unsigned* const above = w + {{ name }}_ABOVE + part * BINS;
        above[b0] = a0;
        above[b1] = a1;
        if (h0) atomicAdd(w + {{ name }}_HIST + b0, h0);
        if (h1) atomicAdd(w + {{ name }}_HIST + b1, h1);
        hist[b0] = a0;
        hist[b1] = a1;
    }
    __syncthreads();
    {
        unsigned* const keys = w + {{ name }}_KEYS + first;
#pragma unroll
        for (int v = 0; v < SLOTS; ++v)
            if (in(v)) keys[atomicAdd(&hist[bin(x[v])], 1u)] = {{ name }}_order(x[v]);
    }

    // c. Every part's histogram, above[] and keys are in place.
    unsigned arrived = p.parts;
    {{ name }}_arrive(w, arrived);

    // d. The cut bin and how many of the k it still has to give.
    {{ name }}_pick(w + {{ name }}_HIST, BINS, K, sums, sel);
    const unsigned cut = sel[0], in_cut = sel[2];
    unsigned want = K - sel[1];

    // e. The k-th best value T (as its order-key), how many keys equal to T make the cut, and
    // how many keys above and equal to T the parts before this one hold.
    unsigned threshold, ties, above, equal;
    if (in_cut <= RANKED) {
        // Lane q: part q's keys above the cut bin and in it, where its run of the cut bin's
        // keys starts (pre, over the parts before q), and how many keys above the cut bin the
        // parts before this one hold.
        unsigned a = 0u, c = 0u;
        if (lane < p.parts) {
            const unsigned* const aq = w + {{ name }}_ABOVE + lane * BINS;
            a = __ldcg(aq + cut);
            c = (cut > 0 ? __ldcg(aq + cut - 1) : (unsigned)min(p.len, p.n - lane * p.len)) - a;
        }
        unsigned pre = c;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const unsigned up = __shfl_up_sync(0xffffffffu, pre, d);
            if (lane >= d) pre += up;
        }
        pre -= c;
        const unsigned before = __reduce_add_sync(0xffffffffu, lane < part ? a : 0u);
        const unsigned earlier_keys = __shfl_sync(0xffffffffu, pre, part);
        for (int q = warp; q < p.parts; q += WARPS) {
            const unsigned aq = __shfl_sync(0xffffffffu, a, q), cq = __shfl_sync(0xffffffffu, c, q);
            const unsigned at = __shfl_sync(0xffffffffu, pre, q);
            const unsigned* const from = w + {{ name }}_KEYS + q * p.len + aq;
            for (unsigned i = lane; i < cq; i += 32) cand[at + i] = __ldcg(from + i);
        }
        __syncthreads();
{% include "dsa_topk_rank.cuh" %}
        // The candidates of the parts before this one are the list's first earlier_keys.
        const bool mine = tid < (int)earlier_keys;
        const unsigned u = mine ? cand[tid] : 0u;
        above = before + (unsigned)__syncthreads_count(mine && u > threshold);
        equal = (unsigned)__syncthreads_count(mine && u == threshold);
    } else {
        // The cut bin's keys are exactly those whose order lies between its least and greatest
        // (the bin never decreases), so the radix passes need no bin test.
        unsigned lo_c = ~0u, hi_c = 0u;
#pragma unroll
        for (int v = 0; v < SLOTS; ++v) {
            if (in(v) && bin(x[v]) == cut) {
                const unsigned u = {{ name }}_order(x[v]);
                lo_c = min(lo_c, u);
                hi_c = max(hi_c, u);
            }
        }
        lo_c = __reduce_min_sync(0xffffffffu, lo_c);
        hi_c = __reduce_max_sync(0xffffffffu, hi_c);
        if (lane == 0 && lo_c <= hi_c) {
            atomicMin(w + 1, lo_c);
            atomicMax(w + 2, hi_c);
        }
        arrived += p.parts;
        {{ name }}_arrive(w, arrived);
        {{ name }}_Range r{ __ldcg(w + 1), __ldcg(w + 2), 0 };
        for (int pass = 0; r.lo < r.hi; ++pass) {
            const int bins = r.open();
            hist[tid] = 0u;
            hist[tid + THREADS] = 0u;
            __syncthreads();
#pragma unroll
            for (int v = 0; v < SLOTS; ++v) {
                const unsigned u = {{ name }}_order(x[v]);
                if (in(v) && r.holds(u)) atomicAdd(&hist[r.bin(u)], 1u);
            }
            __syncthreads();
            unsigned* const rowwide = w + {{ name }}_PASS + pass * BINS;
            for (int b = tid; b < bins; b += THREADS)
                if (hist[b]) atomicAdd(rowwide + b, hist[b]);
            arrived += p.parts;
            {{ name }}_arrive(w, arrived);
            {{ name }}_pick(rowwide, bins, want, sums, sel);
            r.keep(sel, want);
        }
        threshold = r.lo;
        ties = want;
        // Each part's keys above and equal to T (≤ 512 each a warp, so one word holds both).
        unsigned gt = 0u, eq = 0u;
#pragma unroll
        for (int v = 0; v < SLOTS; ++v) {
            const unsigned u = {{ name }}_order(x[v]);
            gt += in(v) && u > threshold;
            eq += in(v) && u == threshold;
        }
        gt = __reduce_add_sync(0xffffffffu, gt);
        eq = __reduce_add_sync(0xffffffffu, eq);
        if (lane == 0) counts[warp] = gt | eq << 16;
        __syncthreads();
        if (tid == 0) {
            unsigned g = 0u, e = 0u;
            for (int v = 0; v < WARPS; ++v) {
                g += counts[v] & 0xffffu;
                e += counts[v] >> 16;
            }
            w[{{ name }}_COUNTS + 2 * part] = g;
            w[{{ name }}_COUNTS + 2 * part + 1] = e;
        }
        arrived += p.parts;
        {{ name }}_arrive(w, arrived);
        const bool earlier_part = lane < part;
        above = __reduce_add_sync(0xffffffffu, earlier_part ? __ldcg(w + {{ name }}_COUNTS + 2 * lane) : 0u);
        equal = __reduce_add_sync(0xffffffffu, earlier_part ? __ldcg(w + {{ name }}_COUNTS + 2 * lane + 1) : 0u);
    }

    // f. The part's keys above T and its share of the first `ties` equal to T, at their ranks.
    // One (above, equal) count per slot and warp, ≤ 32 each and ≤ 8192 over the part, so both
    // share one scan in two half-words.
    const {{ name }}_Cut cut_at{ {{ name }}_value(threshold), ties, above, equal, o };
    __syncthreads();
#pragma unroll
    for (int v = 0; v < SLOTS; ++v)
        if (v < p.slots) cut_at.count(x[v], in(v), &counts[v * WARPS + warp]);
    __syncthreads();
    {
        const bool mine = tid < p.slots * WARPS;
        unsigned total;
        const unsigned before = {{ name }}_scan(mine ? counts[tid] : 0u, sums, total);
        if (mine) counts[tid] = before;
    }
    __syncthreads();
#pragma unroll
    for (int v = 0; v < SLOTS; ++v)
        if (v < p.slots) cut_at.place(x[v], in(v), counts[v * WARPS + warp], first + v * THREADS + tid);
}
{% endif %}
