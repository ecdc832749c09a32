// moe.combine: y[t] = Σ_j weights[t,j] · rows[position[t,j]]{% if shared %} + shared[t]{% endif %} over {{ top_k }} slots of
// {{ dim }} columns, in f32, slot order (the interpreter's order). One block of {{ threads }} threads per token,
// a thread per {{ vec }} adjacent columns, so every routed row is read once, coalesced. A slot
// without a routed row (position −1: its expert id was out of range) makes the token NaN.
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
    constexpr int D = {{ dim }}, K = {{ top_k }}, V = {{ vec }};
    __shared__ i64 pos[K];
    __shared__ float w[K];
    const i64 t = blockIdx.x;
    if (t >= tokens) return;
    for (int j = threadIdx.x; j < K; j += blockDim.x) {
        pos[j] = position[t * K + j];
        w[j] = weights[t * weights_row + j];
    }
    __syncthreads();
    bool bad = false;
    for (int j = 0; j < K; ++j) bad |= pos[j] < 0;
    for (int c = threadIdx.x * V; c < D; c += blockDim.x * V) {
        float acc[V];
{%- if shared %}
        ld_vec<{{ shared_t }}, V>(shared + t * shared_row + c, acc);
{%- else %}
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] = 0.f;
{%- endif %}
        for (int j = 0; j < K && !bad; ++j) {
            float r[V];
            ld_vec<{{ rows_t }}, V>(routed + pos[j] * D + c, r);
#pragma unroll
            for (int i = 0; i < V; ++i) acc[i] += w[j] * r[i];
        }
        if (bad)
#pragma unroll
            for (int i = 0; i < V; ++i) acc[i] = nan_f32();
        st_vec<{{ y_t }}, V>(y + t * y_row + c, acc);
    }
}
