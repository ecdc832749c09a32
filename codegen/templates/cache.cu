// cache.update: row i of the new values ({{ cols }} wide) is written at
// positions[i] of {% if batched %}sequence i's cache{% elif slotted %}the cache of slot cache_slot[0]{% else %}the sequence's cache{% endif %} (sequences `seq_stride` elements apart).
// Positions outside 0..capacity are skipped; the runtime checks them before it launches.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}(
    {{ c_t }}* __restrict__ cache, i64 seq_stride, i64 capacity,
    const {{ x_t }}* __restrict__ x, i64 x_stride,
    const i64* __restrict__ positions, i64 rows{%- if slotted %},
    const i64* __restrict__ cache_slot{%- endif %})
{
    grid_dependency_control();
    constexpr i64 CHUNKS = {{ cols }} / {{ vec }};
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * CHUNKS) return;
    const i64 r = i / CHUNKS, c = (i % CHUNKS) * {{ vec }};
    const i64 p = positions[r];
    if (p < 0 || p >= capacity) return;
    float v[{{ vec }}];
    ld_vec<{{ x_t }}, {{ vec }}>(x + r * x_stride + c, v);
    st_vec<{{ c_t }}, {{ vec }}>(cache + {% if batched %}r * seq_stride + {% elif slotted %}cache_slot[0] * seq_stride + {% endif %}p * {{ cols }} + c, v);
}
