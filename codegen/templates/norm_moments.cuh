{#- Statements both norm kernels take a row's statistics with, from the ITEMS × V values `v` a
    thread holds (columns (it · T + thread) · V, those below D), in f32, one block reduction a
    moment, summed in the same order in both. Declares mean and inv. #}
    float acc = 0.f;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int c = (it * T + threadIdx.x) * V;
        if (c < D) {
#pragma unroll
            for (int k = 0; k < V; ++k) acc += {% if layernorm %}v[it][k]{% else %}v[it][k] * v[it][k]{% endif %};
        }
    }
    acc = block_sum(acc, scratch);
{%- if layernorm %}
    const float mean = acc / D;
    float var = 0.f;
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
        const int c = (it * T + threadIdx.x) * V;
        if (c < D) {
#pragma unroll
            for (int k = 0; k < V; ++k) var += (v[it][k] - mean) * (v[it][k] - mean);
        }
    }
    var = block_sum(var, scratch);
    const float inv = 1.f / sqrtf(var / D + eps);
{%- else %}
    const float mean = 0.f;
    const float inv = 1.f / sqrtf(acc / D + eps);
{%- endif %}
