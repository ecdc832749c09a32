// {{ op }}: one block of {{ threads }} threads per row of {{ cols }} logits.
{%- if top_p %}
// Sampling follows the definition of `sample.top_p` exactly. Fast path: every token of the
// nucleus has probability at least 1/{{ cap }} whenever the tokens above 1/{{ cap }} already hold
// top_p of the mass, and there are at most {{ cap }} of those; they are gathered into shared
// memory, sorted (probability descending, index ascending) and walked: three passes over the
// row. Otherwise (a flat distribution): the nucleus is every token above a threshold τ plus, in
// index order, as many tokens tied at τ as it takes to reach top_p; τ and the drawn token's
// probability are found by bisection on the bits of an f32 probability (non-negative floats
// order like their bits), each step one block reduction over the row: about 60 passes.
// Probabilities are recomputed by one expression every time, so every comparison sees identical
// values and the result is deterministic for a given draw. Every loop over the row is unrolled
// eight times so a thread keeps eight loads in flight: one block streams the whole row, and with
// one load at a time it waits on memory latency rather than bandwidth.
{%- endif %}

// The best (value, index) of two: larger value, then smaller index; NaN never wins.
__device__ __forceinline__ void best_of(float& v, i64& i, float ov, i64 oi) {
    const bool take = !isnan(ov) && (isnan(v) || ov > v || (ov == v && oi < i));
    if (take) { v = ov; i = oi; }
}

__device__ i64 {{ name }}_argmax(const {{ x_t }}* __restrict__ x, float* sv, i64* si) {
    float v = nan_f32();
    i64 idx = 0;
#pragma unroll 8
    for (i64 c = threadIdx.x; c < {{ cols }}; c += blockDim.x) best_of(v, idx, ld(x + c), c);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        best_of(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = v; si[threadIdx.x >> 5] = idx; }
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? sv[threadIdx.x] : nan_f32();
        idx = threadIdx.x < (blockDim.x >> 5) ? si[threadIdx.x] : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            best_of(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
        if (threadIdx.x == 0) si[0] = idx;
    }
    __syncthreads();
    // A row with no number in it has no argmax: -1, as the interpreter says.
    const i64 best = isnan(ld(x + si[0])) ? -1 : si[0];
    __syncthreads();
    return best;
}
{% if top_p %}
struct {{ name }}_Row {
    const {{ x_t }}* x;
    float max, inv_t, inv_z;
    __device__ float p(i64 c) const {
        const float l = ld(x + c);
        return isnan(l) ? 0.f : expf((l - max) * inv_t) * inv_z;
    }
};

// Σ p over tokens with p ≥ threshold (above_only: p > threshold).
__device__ float {{ name }}_mass(const {{ name }}_Row& row, float threshold, bool above_only, float* scratch) {
    float acc = 0.f;
#pragma unroll 8
    for (i64 c = threadIdx.x; c < {{ cols }}; c += blockDim.x) {
        const float p = row.p(c);
        if (above_only ? p > threshold : p >= threshold) acc += p;
    }
    return block_sum(acc, scratch);
}

// The largest τ in [0, 1] with mass(τ) reaching `goal` (`strict`: exceeding it).
__device__ float {{ name }}_threshold(const {{ name }}_Row& row, float goal, bool strict, float* scratch) {
    unsigned lo = 0u, hi = 0x3f800000u;  // the bits of 0.0f and 1.0f
    while (lo < hi) {
        const unsigned mid = lo + (hi - lo + 1) / 2;
        const float m = {{ name }}_mass(row, __uint_as_float(mid), false, scratch);
        if (strict ? m > goal : m >= goal) lo = mid; else hi = mid - 1;
    }
    return __uint_as_float(lo);
}

// The index of the j-th (0-based) token whose probability equals `value`, in index order.
__device__ i64 {{ name }}_nth_tie(const {{ name }}_Row& row, float value, i64 j, i64* counts) {
    const i64 chunk = ({{ cols }} + blockDim.x - 1) / blockDim.x;
    const i64 begin = threadIdx.x * chunk;
    const i64 end = begin + chunk < {{ cols }} ? begin + chunk : {{ cols }};
    i64 mine = 0;
    for (i64 c = begin; c < end; ++c) mine += row.p(c) == value;
    __syncthreads();
    counts[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        i64 run = 0;
        for (int t = 0; t < blockDim.x; ++t) { const i64 n = counts[t]; counts[t] = run; run += n; }
    }
    __syncthreads();
    __shared__ i64 found;
    if (threadIdx.x == 0) found = -1;
    __syncthreads();
    i64 k = counts[threadIdx.x];
    for (i64 c = begin; c < end; ++c) {
        if (row.p(c) == value) {
            if (k == j) found = c;
            ++k;
        }
    }
    __syncthreads();
    return found;
}

// The fast path: the drawn token when the tokens with p ≥ 1/CAP hold at least `goal` of the mass
// (and fit), else -1.
__device__ i64 {{ name }}_small_nucleus(const {{ name }}_Row& row, float goal, float u, float* scratch) {
    constexpr int CAP = {{ cap }};
    __shared__ float cand_p[CAP];
    __shared__ int cand_i[CAP];
    __shared__ int count;
    __shared__ i64 pick;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    float held = 0.f;
#pragma unroll 8
    for (i64 c = threadIdx.x; c < {{ cols }}; c += blockDim.x) {
        const float p = row.p(c);
        if (p >= 1.f / CAP) {
            const int k = atomicAdd(&count, 1);
            if (k < CAP) { cand_p[k] = p; cand_i[k] = (int)c; }
            held += p;
        }
    }
    held = block_sum(held, scratch);
    const int n = count;
    if (goal >= 1.f || held < goal || n > CAP) return -1;
    int size = 1;
    while (size < n) size <<= 1;
    for (int k = n + threadIdx.x; k < size; k += blockDim.x) { cand_p[k] = -1.f; cand_i[k] = 0x7fffffff; }
    __syncthreads();
    // Bitonic sort, probability descending then index ascending (the order of the definition).
    for (int width = 2; width <= size; width <<= 1) {
        for (int j = width >> 1; j > 0; j >>= 1) {
            for (int a = threadIdx.x; a < size; a += blockDim.x) {
                const int b = a ^ j;
                if (b > a) {
                    const bool before = cand_p[b] > cand_p[a] || (cand_p[b] == cand_p[a] && cand_i[b] < cand_i[a]);
                    const bool descending = (a & width) == 0;
                    if (before == descending) {
                        const float tp = cand_p[a]; cand_p[a] = cand_p[b]; cand_p[b] = tp;
                        const int ti = cand_i[a]; cand_i[a] = cand_i[b]; cand_i[b] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) {
        float cum = 0.f;
        int last = 0;
        while (last < n) { cum += cand_p[last]; if (cum >= goal) break; ++last; }
        if (last == n) last = n - 1;
        const float target = u * cum;
        float run = 0.f;
        int k = 0;
        for (; k < last; ++k) { run += cand_p[k]; if (run > target) break; }
        pick = cand_i[k];
    }
    __syncthreads();
    return pick;
}
{% endif %}
// One block per SM at least, as in norm.cu: the one-argument form lets ptxas spill on sm_90a.
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ name }}(
    i64* __restrict__ out, const {{ x_t }}* __restrict__ logits, i64 stride,
{%- if top_p %}
    const float* __restrict__ temperature, const float* __restrict__ top_p,
    const float* __restrict__ uniform,
{%- endif %}
    i64 rows)
{
    grid_dependency_control();
    __shared__ float scratch[32];
    __shared__ i64 scratch_i[{{ threads }}];
    const i64 r = blockIdx.x;
    const {{ x_t }}* x = logits + r * stride;
    const i64 best = {{ name }}_argmax(x, scratch, scratch_i);
{%- if not top_p %}
    if (threadIdx.x == 0) out[r] = best;
{%- else %}
    const float t = temperature[r];
    if (!(t > 0.f) || best < 0 || isinf(ld(x + best))) {
        if (threadIdx.x == 0) out[r] = best;
        return;
    }
    {{ name }}_Row row{x, ld(x + best), 1.f / t, 1.f};
    float z = 0.f;
#pragma unroll 8
    for (i64 c = threadIdx.x; c < {{ cols }}; c += blockDim.x) z += row.p(c);
    row.inv_z = 1.f / block_sum(z, scratch);
    const float goal = top_p[r];
    const i64 fast = {{ name }}_small_nucleus(row, goal, uniform[r], scratch);
    if (fast >= 0) {
        if (threadIdx.x == 0) out[r] = fast;
        return;
    }
    float nucleus;
    float tau = 0.f;
    i64 ties_in = 0;
    if (goal >= 1.f) {
        nucleus = {{ name }}_mass(row, 0.f, false, scratch);
    } else {
        tau = {{ name }}_threshold(row, goal, false, scratch);
        const float above = {{ name }}_mass(row, tau, true, scratch);
        ties_in = tau > 0.f ? (i64)ceilf((goal - above) / tau) : 0;
        if (ties_in < 1) ties_in = 1;
        nucleus = above + ties_in * tau;
    }
    const float target = uniform[r] * nucleus;
    // The drawn token's probability: the largest x whose mass(x) exceeds the target.
    const float x_star = {{ name }}_threshold(row, target, true, scratch);
    const float before = {{ name }}_mass(row, x_star, true, scratch);
    i64 j = x_star > 0.f ? (i64)floorf((target - before) / x_star) : 0;
    if (j < 0) j = 0;
    if (goal < 1.f && x_star == tau && j >= ties_in) j = ties_in - 1;
    i64 pick = {{ name }}_nth_tie(row, x_star, j, scratch_i);
    if (pick < 0) pick = {{ name }}_nth_tie(row, x_star, 0, scratch_i);
    if (threadIdx.x == 0) out[r] = pick < 0 ? best : pick;
{%- endif %}
}
