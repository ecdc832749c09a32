// {{ op }}: out = {{ expr }} over rows of {{ cols }} elements, {{ vec }} per thread
// ({{ vec }}-wide loads and stores: every row start is aligned to them). One thread per vector;
// a memory-bound kernel whose only job is to move each byte once.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}(
    {{ out_t }}* __restrict__ out, i64 out_stride,
    const {{ a_t }}* __restrict__ a, i64 a_stride,
{%- if binary %}
    const {{ b_t }}* __restrict__ b, i64 b_stride, i64 b_rows,
{%- endif %}
    i64 rows, float factor)
{
    grid_dependency_control();
    constexpr i64 CHUNKS = {{ cols }} / {{ vec }};
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * CHUNKS) return;
    const i64 r = i / CHUNKS, c = (i % CHUNKS) * {{ vec }};
    float x[{{ vec }}], o[{{ vec }}];
    ld_vec<{{ a_t }}, {{ vec }}>(a + r * a_stride + c, x);
{%- if binary %}
    float y[{{ vec }}];
    // A right operand with fewer rows repeats (broadcast of a trailing shape).
    ld_vec<{{ b_t }}, {{ vec }}>(b + (r % b_rows) * b_stride + c, y);
{%- endif %}
#pragma unroll
    for (int k = 0; k < {{ vec }}; ++k) {
        const float xv = x[k];
{%- if binary %}
        const float yv = y[k];
{%- endif %}
        o[k] = {{ expr }};
    }
    st_vec<{{ out_t }}, {{ vec }}>(out + r * out_stride + c, o);
}
