// {{ op }}: {% if layernorm %}layernorm{% else %}rmsnorm{% endif %} of the first {{ cols }} columns of each row of x, written at
// positions[r] of {% if batched %}sequence r's cache{% elif slotted %}the cache of slot cache_slot[0]{% else %}the sequence's cache{% endif %}{% if rope %}, columns {{ rope_start }}..{{ rope_end }} rotated
// ({% if interleaved %}pairs (2i, 2i+1){% else %}pairs (i, i+{{ half }}){% endif %}, theta {{ theta }}){% endif %}{% if tail %}; the next {{ tail }} columns are copied unchanged into
// the tail cache{% endif %}. One block of {{ threads }} threads per row, the row in registers
// ({{ items }} × {{ vec }} values a thread) and reduced as the `norm` kernel reduces it; the
// normalised values are rounded to the cache's type where the unfused norm stored them{% if rope %},
// and the rotation reads those rounded values, as the unfused rope did{% endif %}. Positions
// outside 0..capacity are skipped (the whole block leaves before any barrier); the runtime
// checks them before it launches.
{%- if rope %}
__device__ const double {{ name }}_inv_freq[{{ half }}] = { {{ inv_freq }} };
{%- endif %}

extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ name }}(
    {{ c_t }}* __restrict__ cache, i64 seq_stride,
{%- if tail %}
    {{ c_t }}* __restrict__ tail_cache, i64 tail_seq_stride,
{%- endif %}
    i64 capacity,
    const {{ x_t }}* __restrict__ x, i64 x_stride,
    const i64* __restrict__ positions,
    const {{ w_t }}* __restrict__ w,
{%- if layernorm %}
    const {{ bias_t }}* __restrict__ bias,
{%- endif %}
    i64 rows, float eps{%- if slotted %},
    const i64* __restrict__ cache_slot{%- endif %})
{
    grid_dependency_control();
    constexpr int D = {{ cols }}, V = {{ vec }}, ITEMS = {{ items }}, T = {{ threads }};
    __shared__ float scratch[32];
    const i64 row = blockIdx.x;
    const i64 p = positions[row];
    if (p < 0 || p >= capacity) return;
    const i64 seq = {% if batched %}row{% elif slotted %}cache_slot[0]{% else %}0{% endif %};
    const {{ x_t }}* xr = x + row * x_stride;
{%- if tail %}
    constexpr int E = {{ tail }};
    for (int c = threadIdx.x * V; c < E; c += T * V) {
        float t[V];
        ld_vec<{{ x_t }}, V>(xr + D + c, t);
        st_vec<{{ c_t }}, V>(tail_cache + seq * tail_seq_stride + p * E + c, t);
    }
{%- endif %}
    float v[ITEMS][V];
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int c = (it * T + threadIdx.x) * V;
        if (c < D) {
            ld_vec<{{ x_t }}, V>(xr + c, v[it]);
        }
    }
{% include "norm_moments.cuh" %}
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int c = (it * T + threadIdx.x) * V;
        if (c < D) {
            float g[V];
            ld_vec<{{ w_t }}, V>(w + c, g);
{%- if layernorm %}
            float b[V];
            ld_vec<{{ bias_t }}, V>(bias + c, b);
#pragma unroll
            for (int k = 0; k < V; ++k) v[it][k] = rnd<{{ c_t }}>((v[it][k] - mean) * inv * g[k] + b[k]);
{%- else %}
#pragma unroll
            for (int k = 0; k < V; ++k) v[it][k] = rnd<{{ c_t }}>(g[k] * ((v[it][k] - mean) * inv));
{%- endif %}
        }
    }
{%- if rope %}
    // The rotated span goes through shared memory, where each value meets its pair's.
    constexpr int RS = {{ rope_start }}, RE = {{ rope_end }}, HALF = {{ half }};
    __shared__ float span[RE - RS];
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int c = (it * T + threadIdx.x) * V;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            if (c < D && c + k >= RS && c + k < RE) span[c + k - RS] = v[it][k];
        }
    }
    __syncthreads();
    const double two_pi = 6.283185307179586;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int c = (it * T + threadIdx.x) * V;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const int j = c + k - RS;
            if (c >= D || j < 0 || j >= RE - RS) continue;
{%- if interleaved %}
            const int pair = j >> 1;
            const bool first = (j & 1) == 0;
            const int other = first ? j + 1 : j - 1;
{%- else %}
            const bool first = j < HALF;
            const int pair = first ? j : j - HALF;
            const int other = first ? j + HALF : j - HALF;
{%- endif %}
            double angle = (double)p * {{ name }}_inv_freq[pair];
            angle -= two_pi * rint(angle / two_pi);
            float s, co;
            // As the rope kernel: |angle| ≤ π, where the fast intrinsic is accurate to 4e-7.
            __sincosf((float)angle, &s, &co);
            const float x0 = first ? span[j] : span[other], x1 = first ? span[other] : span[j];
            v[it][k] = first ? x0 * co - x1 * s : x1 * co + x0 * s;
        }
    }
{%- endif %}
    {{ c_t }}* out = cache + seq * seq_stride + p * D;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int c = (it * T + threadIdx.x) * V;
        if (c < D) st_vec<{{ c_t }}, V>(out + c, v[it]);
    }
}
