// dsa.topk: the {{ k }} best of the keys j ≤ position in each row of scores, in ascending key
// order, −1 padded; a row with at most {{ k }} keys gets them all. "Best" is the higher score, then
// the lower index, as the interpreter's `dsa.topk` ranks them; −0.0 and +0.0 are one value (NaN,
// which the interpreter refuses, ranks as −∞ so that the kernel still ends). The result is a set,
// so it is written in key order: no sort, and the sparse attention that reads it gathers cache
// rows in address order.
//
// One block of 1024 threads per row (more rows than dsa_topk_split.cu takes). It is latency
// bound (8192 keys are 32 KB, one SM reads them from L2 in well under a microsecond), so the
// design counts dependent steps, not bytes:
// 1. the row is read once, coalesced, onto the chip: thread t holds keys v·1024 + t for
//    v < {{ slots }}, the first {{ held }} in registers and the rest in shared memory (4 KiB a slot, only
//    ever touched by its own thread: no barrier, no bank conflict). The lowering sizes the slots
//    by the context, at most 32 (a 32k row): 9 registers + 23 shared slots is what fits SM120
//    (64 registers a thread at 1024 threads without spilling, 99 KiB of shared memory). Where the
//    context is longer, the keys beyond the slots are read again from L2 by each pass below
//    (four loads in flight a thread), and those loads cost a register: 8 + 23 slots;
// 2. the row's least and greatest score (warp reductions, one barrier);
// 3. one histogram of 1024 bins linear in the score between them. Indexer scores are bell-shaped
//    sums, so a bin holds about n/1024 × (peak density × range) keys: some 20 to 100 at 8k to 32k,
//    where bins of the float's top bits (exponent and 2 to 3 mantissa bits) put hundreds to
//    thousands of keys in a few bins, serialising the shared atomics and needing 3 to 4 passes.
//    The bin is (s − min) · (1024 / (max − min)), correctly rounded, so it never decreases as s
//    grows: every key of a higher bin beats every key of a lower one, equal scores share a bin.
//    Rows whose range is zero or not finite take the order-preserving u32's top 10 bits instead;
// 4. one block scan over the bins (one a thread) finds the bin of the k-th best and how many keys
//    beat it;
// 5. that bin's keys are resolved exactly: at most {{ ranked }} of them are copied to shared memory
//    and each is ranked by comparing it with all the others (c²/1024 ≤ 64 comparisons a thread,
//    no barrier between them); more (a spike of equal scores, or an outlier stretching the range)
//    are narrowed on chip by radix passes of up to 1024 bins over the order-keys between the
//    bin's least and greatest, at most 4 passes for 32 bits, none when all are equal;
// 6. the keys above the k-th best value T and the first `ties` keys equal to T, in key order: per
//    slot and warp a ballot counts them, one block scan over the (slot, warp) counts places each
//    key at its rank, and the writes go straight from the chip.
// About 10 barriers for a row that fits the chip, where the radix select before this kernel took
// about 30 and read the row 3 to 5 times from L2 (19 µs for one 8k row, 52 µs for a 32k one).
// Shared memory: dynamic 1024 + {{ ranked }} + 1024 · ({{ slots }} − {{ held }}) words; 40 static.
constexpr int {{ name }}_SLOTS = {{ slots }};
constexpr int {{ name }}_BINS = 1024;
constexpr int {{ name }}_RANKED = {{ ranked }};
// Whether a row may be longer than the slots (the context is), so that passes read the rest.
constexpr bool {{ name }}_TAIL = {{ tail }};

{% include "dsa_topk_keys.cuh" %}
// Of hist[0 .. bins) (bins ≤ 1024, a higher bin holding better values, want ≤ their sum), the bin
// of the want-th best value: sel = {bin, values in better bins, values in the bin}, seen by all.
__device__ __forceinline__ void {{ name }}_pick(
    const unsigned* hist, int bins, unsigned want, unsigned* sums, unsigned* sel)
{
    const int b = bins - 1 - (int)threadIdx.x;
    const unsigned h = b >= 0 ? hist[b] : 0u;
    unsigned total;
    const unsigned better = {{ name }}_scan(h, sums, total);
    if (better < want && better + h >= want) {
        sel[0] = b;
        sel[1] = better;
        sel[2] = h;
    }
    __syncthreads();
}

// Calls f(score, valid) for every key of the row, warp-uniformly (f may vote): the slots held in
// registers (x), then those in shared memory (spilled, this thread's first), then the keys beyond
// them from memory, four loads in flight a thread.
template <int R, class F>
__device__ __forceinline__ void {{ name }}_visit(
    const float (&x)[R], const float* spilled, const float* s, int n, F f)
{
    const int tid = threadIdx.x;
#pragma unroll
    for (int v = 0; v < R; ++v)
        if (v * 1024 < n) f(x[v], v * 1024 + tid < n);
#pragma unroll 2
    for (int v = R; v < {{ name }}_SLOTS && v * 1024 < n; ++v)
        f(spilled[(v - R) * 1024], v * 1024 + tid < n);
    for (int j0 = {{ name }}_SLOTS * 1024; {{ name }}_TAIL && j0 < n; j0 += 4 * 1024) {
        float y[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int j = j0 + q * 1024 + tid;
            y[q] = j < n ? {{ name }}_canon(s[j]) : 0.f;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
            if (j0 + q * 1024 < n) f(y[q], j0 + q * 1024 + tid < n);
    }
}

// Writes the chosen keys among j0 + v·1024 + thread for the R slots of x and the m of spilled
// (R + m ≤ 32): those above t and, of those equal to t, the first `ties` of the row. cut.above
// and cut.equal count the keys before j0 and are advanced; the result says whether all k are
// written. One (above, equal) count per slot and warp, ≤ 32 each and ≤ 32768 over all, so both
// share one scan in two half-words.
template <int R>
__device__ __forceinline__ bool {{ name }}_write(
    const float (&x)[R], const float* spilled, int m, int j0, int n, {{ name }}_Cut& cut,
    unsigned* counts, unsigned* sums)
{
    const int tid = threadIdx.x, warp = tid >> 5;
    __syncthreads();
#pragma unroll
    for (int v = 0; v < R; ++v) {
        const int j = j0 + v * 1024 + tid;
        cut.count(x[v], j < n, &counts[v * 32 + warp]);
    }
#pragma unroll 2
    for (int v = R; v < R + m; ++v) {
        const int j = j0 + v * 1024 + tid;
        cut.count(spilled[(v - R) * 1024], j < n, &counts[v * 32 + warp]);
    }
    __syncthreads();
    const bool mine = tid < (R + m) * 32;
    unsigned total;
    const unsigned before = {{ name }}_scan(mine ? counts[tid] : 0u, sums, total);
    if (mine) counts[tid] = before;
    __syncthreads();
#pragma unroll
    for (int v = 0; v < R; ++v) {
        const int j = j0 + v * 1024 + tid;
        if (j0 + v * 1024 < n) cut.place(x[v], j < n, counts[v * 32 + warp], j);
    }
#pragma unroll 2
    for (int v = R; v < R + m && j0 + v * 1024 < n; ++v) {
        const int j = j0 + v * 1024 + tid;
        cut.place(spilled[(v - R) * 1024], j < n, counts[v * 32 + warp], j);
    }
    cut.above += total & 0xffffu;
    cut.equal += total >> 16;
    return cut.above + min(cut.equal, cut.ties) >= (unsigned){{ k }};
}

extern "C" __global__ void __launch_bounds__(1024, 1) {{ name }}(
    i64* __restrict__ out, i64 out_row,
    const float* __restrict__ scores, i64 scores_row,
    const i64* __restrict__ positions, i64 rows)
{
    grid_dependency_control();
    constexpr int K = {{ k }}, SLOTS = {{ name }}_SLOTS, BINS = {{ name }}_BINS;
    constexpr int RANKED = {{ name }}_RANKED, HELD = {{ held }};
    // Dynamic: the histogram (then the write's (slot, warp) counts), the ranked candidates and
    // the slots spilled to shared memory.
    unsigned* const hist = reinterpret_cast<unsigned*>(dynamic_smem);
    unsigned* const cand = hist + BINS;
    __shared__ unsigned sums[32];
    __shared__ unsigned sel[3];
    __shared__ unsigned row_lo, row_hi, bin_lo, bin_hi, taken;
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const int tid = threadIdx.x, lane = tid & 31;
    const i64 valid = positions[row] + 1;
    const float* s = scores + row * scores_row;
    if (valid <= K) {
        for (int i = tid; i < K; i += 1024) out[row * out_row + i] = i < valid ? i : -1;
        return;
    }
    // The lowering bounds the context below 2^31.
    const int n = (int)valid;

    // 1. The row on chip, and 2. its least and greatest score. The held slots' loads first; then
    // the spilled ones eight at a time (their values wait in registers until stored), so a 32k
    // row takes three round trips to L2, the last overlapping the barrier below.
    float x[HELD];
#pragma unroll
    for (int v = 0; v < HELD; ++v) {
        const int j = v * 1024 + tid;
        x[v] = j < n ? {{ name }}_canon(s[j]) : 0.f;
    }
    float* const spilled = reinterpret_cast<float*>(cand + RANKED) + tid;
#pragma unroll 1
    for (int v0 = HELD; v0 < SLOTS && v0 * 1024 < n; v0 += 8) {
        float y[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int j = (v0 + q) * 1024 + tid;
            y[q] = v0 + q < SLOTS && j < n ? {{ name }}_canon(s[j]) : 0.f;
        }
#pragma unroll
        for (int q = 0; q < 8; ++q)
            if (v0 + q < SLOTS) spilled[(v0 + q - HELD) * 1024] = y[q];
    }
    hist[tid] = 0u;
    if (tid == 0) {
        row_lo = bin_lo = ~0u;
        row_hi = bin_hi = 0u;
        taken = 0u;
    }
    __syncthreads();
    unsigned lo_u = ~0u, hi_u = 0u;
    {{ name }}_visit(x, spilled, s, n, [&](float f, bool in) {
        if (in) {
            const unsigned u = {{ name }}_order(f);
            lo_u = min(lo_u, u);
            hi_u = max(hi_u, u);
        }
    });
    lo_u = __reduce_min_sync(0xffffffffu, lo_u);
    hi_u = __reduce_max_sync(0xffffffffu, hi_u);
    if (lane == 0) {
        atomicMin(&row_lo, lo_u);
        atomicMax(&row_hi, hi_u);
    }
    __syncthreads();

    // 3. The histogram: bins linear in the score where the range allows.
    const float lo = {{ name }}_value(row_lo), span = __fsub_rn({{ name }}_value(row_hi), lo);
    const float scale = __fdiv_rn((float)BINS, span);
    const bool linear = span > 0.f && isfinite(span) && isfinite(scale);
    const auto bin = [=](float f) -> unsigned {
        return linear ? min((unsigned)BINS - 1u, __float2uint_rz(__fmul_rn(__fsub_rn(f, lo), scale)))
                      : {{ name }}_order(f) >> 22;
    };
    {{ name }}_visit(x, spilled, s, n, [&](float f, bool in) {
        if (in) atomicAdd(&hist[bin(f)], 1u);
    });
    __syncthreads();

    // 4. The bin of the k-th best, and how many of the k it still has to give.
    {{ name }}_pick(hist, BINS, K, sums, sel);
    const unsigned cut_bin = sel[0], in_cut = sel[2];
    unsigned want = K - sel[1];

    // 5. The k-th best value T (as its order) and how many keys equal to T make the cut.
    unsigned threshold, ties;
    if (in_cut <= RANKED) {
        {{ name }}_visit(x, spilled, s, n, [&](float f, bool in) {
            const bool take = in && bin(f) == cut_bin;
            const unsigned ballot = __ballot_sync(0xffffffffu, take);
            if (ballot) {
                unsigned base = 0u;
                if (lane == 0) base = atomicAdd(&taken, (unsigned)__popc(ballot));
                base = __shfl_sync(0xffffffffu, base, 0);
                if (take) cand[base + __popc(ballot & ((1u << lane) - 1u))] = {{ name }}_order(f);
            }
        });
        __syncthreads();
{% include "dsa_topk_rank.cuh" %}
    } else {
        // The cut bin's keys are exactly those whose order lies between its least and greatest
        // (the bin never decreases), so the radix passes need no bin test.
        unsigned a = ~0u, b = 0u;
        {{ name }}_visit(x, spilled, s, n, [&](float f, bool in) {
            if (in && bin(f) == cut_bin) {
                const unsigned u = {{ name }}_order(f);
                a = min(a, u);
                b = max(b, u);
            }
        });
        a = __reduce_min_sync(0xffffffffu, a);
        b = __reduce_max_sync(0xffffffffu, b);
        if (lane == 0) {
            atomicMin(&bin_lo, a);
            atomicMax(&bin_hi, b);
        }
        __syncthreads();
        {{ name }}_Range r{ bin_lo, bin_hi, 0 };
        while (r.lo < r.hi) {
            const int bins = r.open();
            if (tid < bins) hist[tid] = 0u;
            __syncthreads();
            {{ name }}_visit(x, spilled, s, n, [&](float f, bool in) {
                const unsigned u = {{ name }}_order(f);
                if (in && r.holds(u)) atomicAdd(&hist[r.bin(u)], 1u);
            });
            __syncthreads();
            {{ name }}_pick(hist, bins, want, sums, sel);
            r.keep(sel, want);
        }
        threshold = r.lo;
        ties = want;
    }

    // 6. The keys above T and the first `ties` equal to T, at their ranks in key order.
    {{ name }}_Cut cut{ {{ name }}_value(threshold), ties, 0u, 0u, out + row * out_row };
    bool done = {{ name }}_write(x, spilled, SLOTS - HELD, 0, n, cut, hist, sums);
    for (int j0 = SLOTS * 1024; {{ name }}_TAIL && !done && j0 < n; j0 += 8 * 1024) {
        float y[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int j = j0 + q * 1024 + tid;
            y[q] = j < n ? {{ name }}_canon(s[j]) : 0.f;
        }
        done = {{ name }}_write(y, nullptr, 0, j0, n, cut, hist, sums);
    }
}
