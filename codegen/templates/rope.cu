// rope: rotary embedding of {{ dim }} dims ({% if interleaved %}pairs (2i, 2i+1){% else %}pairs (i, i+{{ half }}){% endif %}),
// theta {{ theta }}; `heads` consecutive rows share one position. One thread per pair. The
// frequencies are the interpreter's f64 values; the angle is formed and reduced to [-π, π] in
// f64, so positions near 10^6 keep f32 accuracy, and only the sine and cosine are f32.
__device__ const double {{ name }}_inv_freq[{{ half }}] = { {{ inv_freq }} };

extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}(
    {{ y_t }}* __restrict__ y, i64 y_stride,
    const {{ x_t }}* __restrict__ x, i64 x_stride,
    const i64* __restrict__ positions, i64 rows, i64 heads)
{
    grid_dependency_control();
    constexpr int HALF = {{ half }};
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * HALF) return;
    const i64 r = i / HALF;
    const int k = (int)(i % HALF);
    const double two_pi = 6.283185307179586;
    double angle = (double)positions[r / heads] * {{ name }}_inv_freq[k];
    angle -= two_pi * rint(angle / two_pi);
    float s, c;
    // |angle| ≤ π, where the fast intrinsic is accurate to 4e-7 and needs no local-memory
    // argument reduction (sincosf would reserve a stack frame for it).
    __sincosf((float)angle, &s, &c);
{%- if interleaved %}
    const int i0 = 2 * k, i1 = 2 * k + 1;
{%- else %}
    const int i0 = k, i1 = k + HALF;
{%- endif %}
    const float x0 = ld(x + r * x_stride + i0), x1 = ld(x + r * x_stride + i1);
    st(y + r * y_stride + i0, x0 * c - x1 * s);
    st(y + r * y_stride + i1, x1 * c + x0 * s);
}
