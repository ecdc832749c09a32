// {{ op }} over rows of {{ cols }}: one block of {{ threads }} threads per row, the
// row held in registers ({{ items }} × {{ vec }} values a thread), statistics in f32 through one
// block reduction{% if layernorm %} per moment{% endif %}. {% if add %}The residual sum is rounded to its
// type and stored first; the norm reads that rounded sum, as the unfused graph does.{% endif %}
// The explicit minimum of one block per SM keeps ptxas from spilling a register on sm_90a
// (seen with 6144-wide bf16 rows under the one-argument form).{% if weights_first %}
// Its weights (the scale{% if layernorm %} and bias{% endif %}), never written, are loaded before the wait for the
// kernel before: read after the reduction, they added a DRAM round trip to the end of every
// norm of a decode step, whose gigabyte of GEMM weights has pushed them out of L2.{% endif %}
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ name }}(
    {{ y_t }}* __restrict__ y, i64 y_stride,
{%- if add %}
    {{ r_t }}* __restrict__ sum_out, i64 sum_stride,
{%- endif %}
    const {{ x_t }}* __restrict__ x, i64 x_stride,
{%- if add %}
    const {{ d_t }}* __restrict__ d, i64 d_stride, i64 d_rows,
{%- endif %}
    const {{ w_t }}* __restrict__ w,
{%- if layernorm %}
    const {{ bias_t }}* __restrict__ bias,
{%- endif %}
    i64 rows, float eps)
{
{%- if weights_first %}
    weights_before_wait();
{%- else %}
    grid_dependency_control();
{%- endif %}
    constexpr int D = {{ cols }}, V = {{ vec }}, ITEMS = {{ items }}, T = {{ threads }};
    __shared__ float scratch[32];
    const i64 row = blockIdx.x;
    float g[ITEMS][V]{% if layernorm %}, b[ITEMS][V]{% endif %};
    const auto load_weights = [&] {
#pragma unroll
        for (int it = 0; it < ITEMS; ++it) {
            const int c = (it * T + threadIdx.x) * V;
            if (c < D) {
                ld_vec{% if weights_first %}_early{% endif %}<{{ w_t }}, V>(w + c, g[it]);
{%- if layernorm %}
                ld_vec{% if weights_first %}_early{% endif %}<{{ bias_t }}, V>(bias + c, b[it]);
{%- endif %}
            }
        }
    };
{%- if weights_first %}
    load_weights();
    // Only weights above (see weights_before_wait): x is the kernel before's output.
    grid_dependency_control();
{%- endif %}
    float v[ITEMS][V];
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int c = (it * T + threadIdx.x) * V;
        if (c < D) {
            ld_vec<{{ x_t }}, V>(x + row * x_stride + c, v[it]);
{%- if add %}
            float e[V];
            ld_vec<{{ d_t }}, V>(d + (row % d_rows) * d_stride + c, e);
#pragma unroll
            for (int k = 0; k < V; ++k) v[it][k] = rnd<{{ r_t }}>(v[it][k] + e[k]);
            st_vec<{{ r_t }}, V>(sum_out + row * sum_stride + c, v[it]);
{%- endif %}
        }
    }
{% include "norm_moments.cuh" %}{%- if not weights_first %}
    load_weights();
{%- endif %}
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int c = (it * T + threadIdx.x) * V;
        if (c < D) {
            float o[V];
{%- if layernorm %}
#pragma unroll
            for (int k = 0; k < V; ++k) o[k] = (v[it][k] - mean) * inv * g[it][k] + b[it][k];
{%- else %}
#pragma unroll
            for (int k = 0; k < V; ++k) o[k] = g[it][k] * ((v[it][k] - mean) * inv);
{%- endif %}
            st_vec<{{ y_t }}, V>(y + row * y_stride + c, o);
        }
    }
}
