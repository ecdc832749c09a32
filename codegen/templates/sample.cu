{%- if not top_p %}
// {{ op }}: one block of {{ threads }} threads per row of {{ cols }} logits.

// The best (value, index) of two: larger value, then smaller index; NaN never wins.
__device__ __forceinline__ void {{ name }}_best_of(float& v, i64& i, float ov, i64 oi) {
    const bool take = !isnan(ov) && (isnan(v) || ov > v || (ov == v && oi < i));
    if (take) { v = ov; i = oi; }
}

__device__ i64 {{ name }}_argmax(const {{ x_t }}* __restrict__ x, float* sv, i64* si) {
    float v = nan_f32();
    i64 idx = 0;
#pragma unroll 8
    for (i64 c = threadIdx.x; c < {{ cols }}; c += blockDim.x) {{ name }}_best_of(v, idx, ld(x + c), c);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        {{ name }}_best_of(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = v; si[threadIdx.x >> 5] = idx; }
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? sv[threadIdx.x] : nan_f32();
        idx = threadIdx.x < (blockDim.x >> 5) ? si[threadIdx.x] : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            {{ name }}_best_of(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
        if (threadIdx.x == 0) si[0] = idx;
    }
    __syncthreads();
    // A row with no number in it has no argmax: -1, as the interpreter says.
    const i64 best = isnan(ld(x + si[0])) ? -1 : si[0];
    __syncthreads();
    return best;
}

// One block per SM at least, as in norm.cu: the one-argument form lets ptxas spill on sm_90a.
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ name }}(
    i64* __restrict__ out, const {{ x_t }}* __restrict__ logits, i64 stride, i64 rows)
{
    grid_dependency_control();
    __shared__ float scratch[32];
    __shared__ i64 scratch_i[{{ threads }}];
    const i64 r = blockIdx.x;
    const i64 best = {{ name }}_argmax(logits + r * stride, scratch, scratch_i);
    if (threadIdx.x == 0) out[r] = best;
}
{%- else %}
// {{ op }}, stage `{{ stage }}` of four: rows × {{ slices }} blocks of {{ threads }} threads, each
// block one slice of {{ per }} × {{ threads }} of a row's {{ cols }} logits.
//
// The definition orders tokens by probability, ties by index. Probability is increasing in the
// logit, and distinct f32 logits give distinct f64 probabilities, so that order is the logits'
// (descending, NaN left out, ties by index), which every stage uses exactly (at T = inf, where
// every probability is 1/n, the index's alone; a finite T past ~1e15, where f64 rounds distinct
// logits' probabilities together, is the one place the two orders part). Each token's
// probability enters as an integer: q = round(expf((x - max) / T) · 2^{{ qshift }}), with
// {{ cols }} · 2^{{ qshift }} ≤ 2^63. Sums of q are exact, so they do not depend on the order in
// which blocks add them (the result is deterministic), and the definition's comparisons become
// integer ones: with Z = Σ q, the nucleus ends at the first token whose cumulative mass reaches
// G = ⌈P · Z⌉ (M: the mass up to it; every token when P ≥ 1 or NaN), and the draw is the first
// token whose cumulative mass reaches ⌊u · M⌋ + 1, both products taken exactly in 128 bits. Only
// q differs from the interpreter's f64 probability (expf's rounding, and 2^-{{ qshift }} of the
// largest, which puts tokens 32 nats below the maximum at probability 0).
//
// Tokens are binned by d = (max - x) / T: bin = (bits(1 + d) - bits(1)) >> 15, {{ bins }} bins
// (the last one takes the rest). That is 256 bins per binade of 1 + d: 1/256 nat wide near the
// maximum, 1/16 nat at d = 16 to 31, past which q is 0. The bin is monotone in the logit, so a
// bin is a run of the order and the cumulative mass before it is the sum of the bins before it.
//
// Stages (one kernel each; each waits for the one before, so each finds the previous one's
// results and zeroed counters in the row's scratch):
// - max: each block's (max, argmax) of its slice; zeroes the row's histogram and counters.
// - hist: every block merges the slices' maxima (the same in every block), answers argmax rows
//   (T ≤ 0 or NaN, no finite maximum), adds its slice's per-bin mass to the row's histogram
//   (shared-memory atomics, then one global 64-bit atomic per non-empty bin); the row's last
//   block (__threadfence + counter) finds Z, G and the bin where the cumulative mass reaches G.
// - nucleus: every block appends its tokens of that bin (one atomic per block for the slots) to
//   the row's candidates; the last block sorts them (logit descending, index ascending, bitonic
//   in shared memory), walks them to M, and finds the draw's target and its bin.
// - draw: the same for the draw's bin; the last block writes the token.
// A bin holding more than {{ cap }} tokens (a near-uniform row at a very high temperature, or
// thousands of equal logits) is refined by the last block alone: bisection over the logit's
// order-preserving key, each step a pass over the row, then ties resolved by counting.
//
// Arithmetic at GLM-5's 154880-token f32 row (620 KB), 256 threads × 8 tokens per block: 76
// blocks per row. max reads the row from DRAM, 8 KB per block with all 8 loads of a thread in
// flight: one memory round trip; hist, nucleus and draw read it again from L2 (one round trip
// each). hist clears and flushes a 16 KB shared histogram per block (8 bins per thread, one
// global atomic per non-empty bin: a few hundred). A refining stage gathers its bin's tokens
// (150-600 for a row of uniform logits in [-2, 2] at T = 1, a handful for a confident row); the
// last block sorts them in log2(n)·(log2(n)+1)/2 bitonic steps (45 for 512) and scans them. So
// one row is four kernels of one round trip plus a short tail each, where one block used to
// stream the row 3-60 times; 64 rows are 4864 blocks per stage, 40 MB from DRAM once and from L2
// three times.
namespace {{ name }}_k {
typedef unsigned long long u64;
constexpr int THREADS = {{ threads }};
constexpr int WARPS = THREADS / 32;
constexpr int PER = {{ per }};
constexpr int SLICE = THREADS * PER;
constexpr int SLICES = {{ slices }};
constexpr int COLS = {{ cols }};
constexpr int BINS = {{ bins }};
constexpr int CAP = {{ cap }};
constexpr int QSHIFT = {{ qshift }};
constexpr unsigned FULL = 0xffffffffu;
static_assert(SLICES * SLICE >= COLS && (SLICES - 1) * SLICE < COLS, "slices cover the row");
static_assert((CAP & (CAP - 1)) == 0, "the sort pads its candidates to a power of two in CAP slots");

// What the stages tell each other, per row.
struct Ctl {
    unsigned done[3];    // blocks finished in the hist, nucleus and draw stages
    unsigned found[2];   // tokens of the refined bin seen by the nucleus and draw stages
    unsigned kmin[2];    // smallest and largest logit key among them
    unsigned kmax[2];
    int bin[2];          // the bin each refines (nucleus: -1 when M is already known)
    unsigned pad;
    u64 above[2];        // mass of the bins before it
    u64 target[2];       // the cumulative mass to reach
    u64 nucleus;         // M, when known without refining
};
// One row's scratch, in 64-bit words: the histogram, the slices' maxima, the candidates (sort
// keys, then masses), the Ctl.
constexpr int HIST = 0;
constexpr int PART = HIST + BINS;
constexpr int CAND = PART + SLICES;
constexpr int CTL = CAND + 2 * CAP;
constexpr int ROW_WORDS = CTL + (int)((sizeof(Ctl) + 7) / 8);
static_assert(ROW_WORDS == {{ row_words }}, "the lowering sizes the scratch by the same layout");

// The best (value, index) of two: larger value, then smaller index; NaN never wins.
__device__ __forceinline__ void best_of(float& v, int& i, float ov, int oi) {
    const bool take = !isnan(ov) && (isnan(v) || ov > v || (ov == v && oi < i));
    if (take) { v = ov; i = oi; }
}

__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        best_of(v, i, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, i, o));
}

// An unsigned key in the logits' order (-0 and +0 equal); value_of inverts it.
__device__ __forceinline__ unsigned key_of(float v) {
    const unsigned u = __float_as_uint(v == 0.f ? 0.f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float value_of(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The row's (max, T): d, the bin and q of a logit, one expression each wherever they are used.
struct Row {
    float max, t;
    __device__ __forceinline__ float d(float v) const { return __fdiv_rn(__fsub_rn(max, v), t); }
    __device__ __forceinline__ int bin(float v) const {
        // d ≥ 0; +inf and NaN (T = inf, x = -inf) land past the last bin and are clamped.
        const unsigned b = (__float_as_uint(__fadd_rn(1.f, d(v))) - 0x3f800000u) >> 15;
        return b < (unsigned)BINS ? (int)b : BINS - 1;
    }
    // The order's key. At T = inf every probability is equal and the order is the index's
    // alone: one key for all.
    __device__ __forceinline__ unsigned key(float v) const { return isinf(t) ? 0x80000000u : key_of(v); }
    __device__ __forceinline__ u64 q(float v) const {
        const float e = expf(-d(v));
        return e > 0.f ? __float2ull_rn(__fmul_rn(e, (float)(1ull << QSHIFT))) : 0ull;
    }
};

// ⌊a · f⌋ (or ⌈a · f⌉ with `up`) exactly, for f in [0, 1): f = mant · 2^-shift, shift ≥ 24.
__device__ __forceinline__ u64 mul_frac(u64 a, float f, bool up) {
    const unsigned bits = __float_as_uint(f);
    const unsigned ex = bits >> 23;
    const u64 mant = ex ? ((bits & 0x7fffffu) | 0x800000u) : (bits & 0x7fffffu);
    const int shift = ex ? 150 - (int)ex : 149;
    const u64 lo = a * mant, hi = __umul64hi(a, mant);
    u64 q;
    bool rest;
    if (shift >= 128) {
        q = 0;
        rest = (lo | hi) != 0;
    } else if (shift >= 64) {
        const int s = shift - 64;
        q = s ? hi >> s : hi;
        rest = lo != 0 || (s && (hi & ((1ull << s) - 1)) != 0);
    } else {
        q = (lo >> shift) | (hi << (64 - shift));
        rest = (lo & ((1ull << shift) - 1)) != 0;
    }
    return q + (up && rest);
}

// Exclusive prefix of v over the block's threads, and the block's total (every thread calls).
__device__ __forceinline__ u64 block_scan(u64 v, u64& total) {
    __shared__ u64 warp_total[WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(FULL, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads();
    if (lane == 31) warp_total[warp] = inc;
    __syncthreads();
    u64 before = 0;
    total = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        const u64 t = warp_total[w];
        if (w < warp) before += t;
        total += t;
    }
    return before + inc - v;
}

// Whether this block is the row's last to pass `done`; the last one then sees every other
// block's writes (which it reads with __ldcg, past L1).
__device__ __forceinline__ bool last_block(unsigned* done) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(done, 1u) == SLICES - 1;
        if (last) __threadfence();
    }
    __syncthreads();
    return last;
}

// The row's (max, argmax) from the slices' (the same in every block); argmax -1 for all NaN.
__device__ __forceinline__ void row_best(const u64* w, float& m, int& best) {
    __shared__ float sv;
    __shared__ int si;
    if (threadIdx.x < 32) {
        float v = nan_f32();
        int i = 0;
        for (int k = threadIdx.x; k < SLICES; k += 32) {
            const u64 p = w[PART + k];
            best_of(v, i, __uint_as_float((unsigned)(p >> 32)), (int)(unsigned)p);
        }
        warp_best(v, i);
        if (threadIdx.x == 0) { sv = v; si = isnan(v) ? -1 : i; }
    }
    __syncthreads();
    m = sv;
    best = si;
}

// The first of the row's bins where the cumulative mass reaches `target` (≤ the total), and
// the mass before it, from the histogram (every thread of the last block calls; thread 0 of
// the block gets the answer in `bin` and `above`).
__device__ __forceinline__ void find_bin(const u64* w, u64 target, int& bin, u64& above) {
    constexpr int OWN = (BINS + THREADS - 1) / THREADS;
    const int first = threadIdx.x * OWN;
    u64 h[OWN];
    u64 mine = 0;
#pragma unroll
    for (int k = 0; k < OWN; ++k) {
        h[k] = first + k < BINS ? __ldcg(w + HIST + first + k) : 0ull;
        mine += h[k];
    }
    u64 total;
    __shared__ int found_bin;
    __shared__ u64 found_above;
    if (threadIdx.x == 0) { found_bin = -1; found_above = 0; }
    u64 cum = block_scan(mine, total);
#pragma unroll
    for (int k = 0; k < OWN; ++k) {
        if (cum < target && cum + h[k] >= target) { found_bin = first + k; found_above = cum; }
        cum += h[k];
    }
    __syncthreads();
    bin = found_bin;
    above = found_above;
}

// The histogram's total mass Z (every thread of the last block calls and gets it).
__device__ __forceinline__ u64 total_mass(const u64* w) {
    constexpr int OWN = (BINS + THREADS - 1) / THREADS;
    u64 mine = 0;
    for (int k = 0; k < OWN; ++k) {
        const int b = threadIdx.x * OWN + k;
        if (b < BINS) mine += __ldcg(w + HIST + b);
    }
    u64 total;
    block_scan(mine, total);
    return total;
}

// Σ q over the row's tokens in bin `b` whose key is at least `k`: one pass by the block.
__device__ __forceinline__ u64 mass_from(const {{ x_t }}* x, const Row& row, int b, unsigned k) {
    u64 acc = 0;
#pragma unroll 8
    for (int c = threadIdx.x; c < COLS; c += THREADS) {
        const float v = ld(x + c);
        if (!isnan(v) && row.key(v) >= k && row.bin(v) == b) acc += row.q(v);
    }
    u64 total;
    block_scan(acc, total);
    return total;
}

// The index of the j-th token (0-based, index order) of bin `b` whose key is `k`: each warp
// counts one segment of the row, the warp holding it finds it. The bin matters at T = inf, where
// every token has one key but -inf ones (probability 0) lie in the last bin.
__device__ __forceinline__ int nth_with_key(const {{ x_t }}* x, const Row& row, int b, unsigned k, u64 j) {
    constexpr int SEG = (COLS + WARPS - 1) / WARPS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int begin = warp * SEG, end = begin + SEG < COLS ? begin + SEG : COLS;
    __shared__ unsigned counts[WARPS];
    __shared__ int found;
    unsigned n = 0;
    for (int c0 = begin; c0 < end; c0 += 32) {
        const int c = c0 + lane;
        float v = nan_f32();
        if (c < end) v = ld(x + c);
        n += __popc(__ballot_sync(FULL, !isnan(v) && row.key(v) == k && row.bin(v) == b));
    }
    __syncthreads();
    if (lane == 0) counts[warp] = n;
    if (threadIdx.x == 0) found = -1;
    __syncthreads();
    u64 before = 0;
    for (int w = 0; w < warp; ++w) before += counts[w];
    if (j >= before && j < before + n) {
        u64 need = j - before;
        for (int c0 = begin; c0 < end; c0 += 32) {
            const int c = c0 + lane;
            float v = nan_f32();
            if (c < end) v = ld(x + c);
            const bool hit = !isnan(v) && row.key(v) == k && row.bin(v) == b;
            const unsigned ballot = __ballot_sync(FULL, hit);
            const unsigned count = __popc(ballot);
            if (need < count) {
                if (hit && __popc(ballot & ((1u << lane) - 1u)) == need) found = c;
                break;
            }
            need -= count;
        }
    }
    __syncthreads();
    return found;
}

// In the last block of a refining stage: the first token of bin `b` (in the order) at which the
// cumulative mass, `above` before the bin, reaches `target`, and that cumulative mass. The bin's
// tokens are the `found` candidates when they fit, else found by passes over the row.
__device__ __forceinline__ void resolve(const {{ x_t }}* x, const Row& row, u64* w, int stage, int b, u64 above,
                        u64 target, bool want_token, int& token, u64& cum) {
    Ctl* ctl = reinterpret_cast<Ctl*>(w + CTL);
    const unsigned n = __ldcg(&ctl->found[stage]);
    __shared__ int s_token;
    __shared__ u64 s_cum;
    if (threadIdx.x == 0) { s_token = -1; s_cum = above; }
    if (n <= (unsigned)CAP) {
        __shared__ u64 key[CAP];
        __shared__ u64 mass[CAP];
        int size = 1;
        while (size < (int)n) size <<= 1;
        for (int i = threadIdx.x; i < size; i += THREADS) {
            key[i] = i < (int)n ? __ldcg(w + CAND + i) : ~0ull;
            mass[i] = i < (int)n ? __ldcg(w + CAND + CAP + i) : 0ull;
        }
        __syncthreads();
        // Bitonic sort, ascending key: logit descending, then index ascending.
        for (int width = 2; width <= size; width <<= 1) {
            for (int j = width >> 1; j > 0; j >>= 1) {
                for (int a = threadIdx.x; a < size; a += THREADS) {
                    const int c = a ^ j;
                    if (c > a && (key[a] > key[c]) == ((a & width) == 0)) {
                        const u64 tk = key[a]; key[a] = key[c]; key[c] = tk;
                        const u64 tm = mass[a]; mass[a] = mass[c]; mass[c] = tm;
                    }
                }
                __syncthreads();
            }
        }
        constexpr int OWN = (CAP + THREADS - 1) / THREADS;
        const int own = (size + THREADS - 1) / THREADS;
        const int first = threadIdx.x * own;
        u64 mine = 0;
        for (int k = 0; k < OWN && k < own; ++k)
            if (first + k < (int)n) mine += mass[first + k];
        u64 total;
        u64 run = above + block_scan(mine, total);
        for (int k = 0; k < OWN && k < own; ++k) {
            const int i = first + k;
            if (i < (int)n && run < target && run + mass[i] >= target) {
                s_token = (int)(unsigned)key[i];
                s_cum = run + mass[i];
            }
            if (i < (int)n) run += mass[i];
        }
        __syncthreads();
        token = s_token;
        cum = s_cum;
        return;
    }
    // Too many to gather: bisect for the largest key v whose tokens of the bin at or above it
    // reach the target; they are ties there, taken in index order.
    unsigned lo = __ldcg(&ctl->kmin[stage]), hi = __ldcg(&ctl->kmax[stage]);
    while (lo < hi) {
        const unsigned mid = lo + (unsigned)(((u64)hi - lo + 1) / 2);
        if (above + mass_from(x, row, b, mid) >= target) lo = mid; else hi = mid - 1;
    }
    const u64 before = above + (lo < __ldcg(&ctl->kmax[stage]) ? mass_from(x, row, b, lo + 1) : 0ull);
    const u64 q = row.q(value_of(lo));
    const u64 j = (target - before + q - 1) / q - 1;
    cum = before + (j + 1) * q;
    token = want_token ? nth_with_key(x, row, b, lo, j) : -1;
}
}  // namespace {{ name }}_k

// The two-argument form: the one-argument form lets ptxas spill (as in norm.cu).
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ name }}(
    i64* __restrict__ out, const {{ x_t }}* __restrict__ logits, i64 stride,
    const float* __restrict__ temperature, const float* __restrict__ top_p,
    const float* __restrict__ uniform, unsigned long long* __restrict__ scratch, i64 rows)
{
    grid_dependency_control();
    using namespace {{ name }}_k;
    const i64 r = blockIdx.x / SLICES;
    const int s = (int)(blockIdx.x % SLICES);
    if (r >= rows) return;
    const {{ x_t }}* x = logits + r * stride;
    u64* w = scratch + r * ROW_WORDS;
    Ctl* ctl = reinterpret_cast<Ctl*>(w + CTL);
    const int first = s * SLICE + threadIdx.x;
    float xs[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int c = first + k * THREADS;
        xs[k] = c < COLS ? ld(x + c) : nan_f32();
    }
{%- if stage == "max" %}
    float v = nan_f32();
    int i = 0;
#pragma unroll
    for (int k = 0; k < PER; ++k) best_of(v, i, xs[k], first + k * THREADS);
    warp_best(v, i);
    __shared__ float sv[WARPS];
    __shared__ int si[WARPS];
    if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = v; si[threadIdx.x >> 5] = i; }
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < WARPS ? sv[threadIdx.x] : nan_f32();
        i = threadIdx.x < WARPS ? si[threadIdx.x] : 0;
        warp_best(v, i);
        if (threadIdx.x == 0) w[PART + s] = ((u64)__float_as_uint(v) << 32) | (unsigned)i;
    }
    for (int b = s * THREADS + threadIdx.x; b < BINS; b += SLICES * THREADS) w[HIST + b] = 0;
    if (s == 0 && threadIdx.x == 0) {
        Ctl c = {};
        c.kmin[0] = c.kmin[1] = FULL;
        c.bin[0] = c.bin[1] = -1;
        *ctl = c;
    }
{%- else %}
    float m;
    int best;
    row_best(w, m, best);
    const float t = temperature[r];
    // Argmax rows (step 1 and 2 of the definition): answered by the hist stage.
    if (!(t > 0.f) || best < 0 || isinf(m)) {
{%- if stage == "hist" %}
        if (s == 0 && threadIdx.x == 0) out[r] = best;
{%- endif %}
        return;
    }
    const Row row{m, t};
{%- if stage == "hist" %}
    __shared__ u64 hist[BINS];
    for (int b = threadIdx.x; b < BINS; b += THREADS) hist[b] = 0;
    __syncthreads();
    // A thread's run of tokens in one bin adds once (a row of equal logits: once per thread).
    int run_bin = -1;
    u64 run = 0;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        if (isnan(xs[k])) continue;
        const int b = row.bin(xs[k]);
        if (b != run_bin) {
            if (run) atomicAdd(&hist[run_bin], run);
            run_bin = b;
            run = 0;
        }
        run += row.q(xs[k]);
    }
    if (run) atomicAdd(&hist[run_bin], run);
    __syncthreads();
    for (int b = threadIdx.x; b < BINS; b += THREADS)
        if (hist[b]) atomicAdd(w + HIST + b, hist[b]);
    if (!last_block(&ctl->done[0])) return;
    const u64 z = total_mass(w);
    const float p = top_p[r];
    u64 g = p < 1.f ? (p > 0.f ? mul_frac(z, p, true) : 0ull) : z;
    if (g < 1) g = 1;
    if (g >= z) {
        // The whole row (P ≥ 1 or NaN, or P within rounding of 1): M = Z, nothing to refine.
        if (threadIdx.x == 0) ctl->nucleus = z;
        return;
    }
    int bin;
    u64 above;
    find_bin(w, g, bin, above);
    if (threadIdx.x == 0) {
        ctl->bin[0] = bin;
        ctl->above[0] = above;
        ctl->target[0] = g;
    }
{%- else %}
{%- if stage == "nucleus" %}
    constexpr int STAGE = 0;
{%- else %}
    constexpr int STAGE = 1;
{%- endif %}
    const int b = ctl->bin[STAGE];
    if (b >= 0) {
        // This slice's tokens of the bin: slots for the block by one atomic, keys' range by one
        // atomic per warp.
        unsigned kmin = FULL, kmax = 0, mine = 0;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            if (!isnan(xs[k]) && row.bin(xs[k]) == b) {
                const unsigned key = row.key(xs[k]);
                kmin = min(kmin, key);
                kmax = max(kmax, key);
                ++mine;
            }
        }
        u64 total;
        const u64 offset = block_scan(mine, total);
        __shared__ unsigned base;
        if (threadIdx.x == 0 && total) base = atomicAdd(&ctl->found[STAGE], (unsigned)total);
        kmin = __reduce_min_sync(FULL, kmin);
        kmax = __reduce_max_sync(FULL, kmax);
        if ((threadIdx.x & 31) == 0 && kmax) {
            atomicMin(&ctl->kmin[STAGE], kmin);
            atomicMax(&ctl->kmax[STAGE], kmax);
        }
        __syncthreads();
        if (total) {
            u64 slot = base + offset;
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                if (!isnan(xs[k]) && row.bin(xs[k]) == b) {
                    if (slot < (u64)CAP) {
                        const unsigned c = (unsigned)(first + k * THREADS);
                        w[CAND + slot] = ((u64)~row.key(xs[k]) << 32) | c;
                        w[CAND + CAP + slot] = row.q(xs[k]);
                    }
                    ++slot;
                }
            }
        }
    }
    if (!last_block(&ctl->done[1 + STAGE])) return;
{%- if stage == "nucleus" %}
    u64 m_mass = ctl->nucleus;
    if (b >= 0) {
        int unused;
        resolve(x, row, w, STAGE, b, ctl->above[STAGE], ctl->target[STAGE], false, unused, m_mass);
    }
    // The draw: the first token whose cumulative mass exceeds ⌊u · M⌋ (u outside [0, 1) clamped).
    const float u = uniform[r];
    const u64 d = u > 0.f ? (u < 1.f ? mul_frac(m_mass, u, false) : m_mass - 1) : 0ull;
    int bin;
    u64 above;
    find_bin(w, d + 1, bin, above);
    if (threadIdx.x == 0) {
        ctl->bin[1] = bin;
        ctl->above[1] = above;
        ctl->target[1] = d + 1;
    }
{%- else %}
    int token;
    u64 reached;
    resolve(x, row, w, STAGE, b, ctl->above[STAGE], ctl->target[STAGE], true, token, reached);
    // The target lies within the bin's mass, so a token is found; the argmax stands in should
    // that ever fail, rather than an unwritten token.
    if (threadIdx.x == 0) out[r] = token < 0 ? best : token;
{%- endif %}
{%- endif %}
{%- endif %}
}
{%- endif %}
