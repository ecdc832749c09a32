// copy: a strided view of rank ≤ 4 into another layout (a concat part its producer
// cannot write in place, or a view no row-wise kernel can address). One thread per element.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}(
    {{ t }}* __restrict__ y, i64 ys0, i64 ys1, i64 ys2, i64 ys3,
    const {{ t }}* __restrict__ x, i64 xs0, i64 xs1, i64 xs2, i64 xs3,
    i64 n0, i64 n1, i64 n2, i64 n3{%- if slotted %},
    const i64* __restrict__ cache_slot, i64 x_slot{%- endif %})
{
    grid_dependency_control();
{%- if slotted %}
    // A prefill's caches are those of slot cache_slot[0]: the source starts that many slots in
    // (0 apart for one held in the arena).
    x += cache_slot[0] * x_slot;
{%- endif %}
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n0 * n1 * n2 * n3) return;
    const i64 i3 = i % n3, i2 = (i / n3) % n2, i1 = (i / (n3 * n2)) % n1, i0 = i / (n3 * n2 * n1);
    y[i0 * ys0 + i1 * ys1 + i2 * ys2 + i3 * ys3] = x[i0 * xs0 + i1 * xs1 + i2 * xs2 + i3 * xs3];
}
