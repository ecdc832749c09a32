// moe.route: sigmoid router over {{ experts }} experts in {{ groups }} group(s) keeping {{ keep }}, top {{ top_k }},
// {% if normalise %}weights normalised, {% endif %}scaled by {{ scaling }}. One warp per token. Everything is in
// f64 as in the interpreter, so the choice of experts is the same even where two scores differ in
// the last f32 bit: sigmoid, choice = s + bias (selection only), group score = sum of the group's
// two best choices (its best for groups of one), the kept groups by score (ties: lower group),
// the other groups' choices −inf, then {{ top_k }} rounds of a warp argmax (ties: lower index).
// Shared memory: two rows of {{ experts }} doubles, far under SM120's 99 KiB.
__device__ __forceinline__ void {{ name }}_best(double& v, int& i, double ov, int oi) {
    if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
}

extern "C" __global__ void __launch_bounds__(32, 1) {{ name }}(
    float* __restrict__ weights, i64 weights_row,
    i64* __restrict__ experts, i64 experts_row,
    const {{ logits_t }}* __restrict__ logits, i64 logits_row,
    const {{ bias_t }}* __restrict__ bias, i64 rows)
{
    constexpr int E = {{ experts }}, GROUPS = {{ groups }}, KEEP = {{ keep }}, TOP_K = {{ top_k }};
    constexpr int GROUP = E / GROUPS;
    __shared__ double s[E], choice[E];
    __shared__ double group_score[GROUPS];
    __shared__ int picked[TOP_K];
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const int lane = threadIdx.x;
    for (int e = lane; e < E; e += 32) {
        s[e] = 1.0 / (1.0 + exp(-(double)ld(logits + row * logits_row + e)));
        choice[e] = s[e] + (double)ld(bias + e);
    }
    __syncwarp();
    if (KEEP < GROUPS) {
        for (int g = lane; g < GROUPS; g += 32) {
            double first = -INFINITY, second = -INFINITY;
            for (int e = g * GROUP; e < (g + 1) * GROUP; ++e) {
                if (choice[e] > first) { second = first; first = choice[e]; }
                else if (choice[e] > second) second = choice[e];
            }
            group_score[g] = GROUP == 1 ? first : first + second;
        }
        __syncwarp();
        if (lane == 0) {
            // Selection of the kept groups: a group is kept when fewer than KEEP groups beat it.
            for (int g = 0; g < GROUPS; ++g) {
                int better = 0;
                for (int o = 0; o < GROUPS; ++o)
                    better += group_score[o] > group_score[g] || (group_score[o] == group_score[g] && o < g);
                if (better >= KEEP)
                    for (int e = g * GROUP; e < (g + 1) * GROUP; ++e) choice[e] = -INFINITY;
            }
        }
        __syncwarp();
    }
    double total = 0.0;
    for (int r = 0; r < TOP_K; ++r) {
        double v = -INFINITY;
        int idx = E;
        for (int e = lane; e < E; e += 32) {
            bool taken = false;
            for (int p = 0; p < r; ++p) taken |= picked[p] == e;
            if (!taken) {{ name }}_best(v, idx, choice[e], e);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            {{ name }}_best(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
        if (lane == 0) picked[r] = idx;
        total += s[idx];
        __syncwarp();
    }
{%- if normalise %}
    const double norm = total + 1e-20;
{%- else %}
    const double norm = 1.0;
{%- endif %}
    for (int r = lane; r < TOP_K; r += 32) {
        weights[row * weights_row + r] = (float)(s[picked[r]] / norm * {{ scaling }});
        experts[row * experts_row + r] = picked[r];
    }
}
