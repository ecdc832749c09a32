// moe.route: sigmoid router over {{ experts }} experts in {{ groups }} group(s) keeping {{ keep }}, top {{ top_k }},
// {% if normalise %}weights normalised, {% endif %}scaled by {{ scaling }}. One block of {{ threads }} threads per token, each
// thread the experts e ≡ thread (mod {{ threads }}). Everything is in f64 as in the interpreter, so the
// choice of experts is the same even where two scores differ in the last f32 bit: sigmoid,
// choice = s + bias (selection only), group score = sum of the group's two best choices (its best
// for groups of one), the kept groups by score (ties: lower group), the other groups' choices
// −inf, then {{ top_k }} rounds of a block argmax (ties: lower index), a taken expert marked in shared
// memory. One warp per token did the same with a warp's lanes looping over the experts and over
// the experts taken so far: 22 µs a token on an H200 for GLM-5's 256 experts, latency-bound.
// Shared memory: two rows of {{ experts }} doubles, far under SM120's 99 KiB.
__device__ __forceinline__ void {{ name }}_best(double& v, int& i, double ov, int oi) {
    if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
}

extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ name }}(
    float* __restrict__ weights, i64 weights_row,
    i64* __restrict__ experts, i64 experts_row,
    const {{ logits_t }}* __restrict__ logits, i64 logits_row,
    const {{ bias_t }}* __restrict__ bias, i64 rows)
{
    grid_dependency_control();
    constexpr int E = {{ experts }}, GROUPS = {{ groups }}, KEEP = {{ keep }}, TOP_K = {{ top_k }};
    constexpr int GROUP = E / GROUPS, T = {{ threads }}, WARPS = T / 32;
    __shared__ double s[E], choice[E];
    __shared__ double group_score[GROUPS];
    __shared__ double warp_v[WARPS];
    __shared__ int warp_i[WARPS];
    __shared__ int picked[TOP_K];
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int e = tid; e < E; e += T) {
        s[e] = 1.0 / (1.0 + exp(-(double)ld(logits + row * logits_row + e)));
        choice[e] = s[e] + (double)ld(bias + e);
    }
    __syncthreads();
    if (KEEP < GROUPS) {
        for (int g = tid; g < GROUPS; g += T) {
            double first = -INFINITY, second = -INFINITY;
            for (int e = g * GROUP; e < (g + 1) * GROUP; ++e) {
                if (choice[e] > first) { second = first; first = choice[e]; }
                else if (choice[e] > second) second = choice[e];
            }
            group_score[g] = GROUP == 1 ? first : first + second;
        }
        __syncthreads();
        // A group is kept when fewer than KEEP groups beat it; the others' experts cannot be chosen.
        for (int e = tid; e < E; e += T) {
            const int g = e / GROUP;
            int better = 0;
            for (int o = 0; o < GROUPS; ++o)
                better += group_score[o] > group_score[g] || (group_score[o] == group_score[g] && o < g);
            if (better >= KEEP) choice[e] = -INFINITY;
        }
        __syncthreads();
    }
    double total = 0.0;
    for (int r = 0; r < TOP_K; ++r) {
        double v = -INFINITY;
        int idx = E;
        // A taken expert's choice is NaN, which never wins (every comparison with it is false).
        for (int e = tid; e < E; e += T) {{ name }}_best(v, idx, choice[e], e);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            {{ name }}_best(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
        if (lane == 0) { warp_v[warp] = v; warp_i[warp] = idx; }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < WARPS; ++w) {{ name }}_best(v, idx, warp_v[w], warp_i[w]);
            picked[r] = idx;
            if (idx < E) choice[idx] = nan("");
        }
        __syncthreads();
        total += picked[r] < E ? s[picked[r]] : 0.0;
    }
{%- if normalise %}
    const double norm = total + 1e-20;
{%- else %}
    const double norm = 1.0;
{%- endif %}
    // A pick that found no expert (every choice NaN: the logits are broken) names expert 0 with
    // a NaN weight, so the experts' kernels stay inside their tables and the NaN stays loud.
    for (int r = tid; r < TOP_K; r += T) {
        const int p = picked[r];
        weights[row * weights_row + r] = p < E ? (float)(s[p] / norm * {{ scaling }}) : nan_f32();
        experts[row * experts_row + r] = p < E ? p : 0;
    }
}
