// moe.combine: y[t] = Σ_j weights[t,j] · rows[position[t,j]]{% if shared %} + shared[t]{% endif %} over {{ top_k }} slots of
// {{ dim }} columns, in f32, slot order (the interpreter's order). A block of {{ threads }} threads per
// token and slice of {{ threads }} × {{ vec }} columns, a thread per {{ vec }} adjacent columns, so every
// routed row is read once, coalesced. A thread issues its {{ top_k }} row loads together and then sums
// them in slot order: summed as they came, one slot after the other, a decode token (one block
// of the whole row before) paid {{ top_k }} dependent L2 round trips per {{ vec }} columns, 8.2 µs a launch
// in GLM-5's batch-1 step on an H200. A slot without a routed row (position −1: its expert id
// was out of range) makes the token NaN.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}(
    {{ y_t }}* __restrict__ y, i64 y_row,
    const {{ rows_t }}* __restrict__ routed,
    const i64* __restrict__ position,
    const float* __restrict__ weights, i64 weights_row,
{%- if shared %}
    const {{ shared_t }}* __restrict__ shared, i64 shared_row,
{%- endif %}
    i64 tokens)
{
    grid_dependency_control();
    constexpr int D = {{ dim }}, K = {{ top_k }}, V = {{ vec }}, T = {{ threads }};
    constexpr int SLICES = (D + T * V - 1) / (T * V);
    const i64 t = blockIdx.x / SLICES;
    const int c = ((int)(blockIdx.x % SLICES) * T + (int)threadIdx.x) * V;
    if (t >= tokens || c >= D) return;
    i64 pos[K];
    float w[K];
    bool bad = false;
#pragma unroll
    for (int j = 0; j < K; ++j) {
        pos[j] = position[t * K + j];
        w[j] = weights[t * weights_row + j];
        bad |= pos[j] < 0;
    }
    float r[K][V];
#pragma unroll
    for (int j = 0; j < K; ++j) {
        if (pos[j] >= 0) {
            ld_vec<{{ rows_t }}, V>(routed + pos[j] * D + c, r[j]);
        } else {
#pragma unroll
            for (int i = 0; i < V; ++i) r[j][i] = 0.f;
        }
    }
    float acc[V];
{%- if shared %}
    ld_vec<{{ shared_t }}, V>(shared + t * shared_row + c, acc);
{%- else %}
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.f;
{%- endif %}
#pragma unroll
    for (int j = 0; j < K; ++j)
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] += w[j] * r[j][i];
    if (bad)
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] = nan_f32();
    st_vec<{{ y_t }}, V>(y + t * y_row + c, acc);
}
