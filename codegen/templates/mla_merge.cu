// {{ op }}, second kernel: the `splits` partial results of the split attention combined,
// out(h) = Σ_s 2^(lse_s − M) · O_s / Σ_s 2^(lse_s − M) with M the largest lse (base 2), from the
// scratch `part` laid out as the first kernel writes it (O [rows][splits][{{ heads }}][512] f32,
// then lse [rows][splits][{{ heads }}]). One block of 128 threads per (row, head), 4 columns a
// thread; a split without keys has lse −inf and weight 0, a row without any key gets zeros.
extern "C" __global__ void __launch_bounds__(128, 1) {{ name }}(
    bf16* __restrict__ out, i64 out_row, i64 out_head,
    const float* __restrict__ part, i64 rows, i64 splits)
{
    grid_dependency_control();
    constexpr int DV = 512, HEADS = {{ heads }};
    const i64 row = blockIdx.x / HEADS;
    const int h = blockIdx.x % HEADS;
    if (row >= rows) return;
    const float* const lse = part + rows * splits * HEADS * DV + row * splits * HEADS + h;
    float top = -INFINITY;
    for (i64 s = 0; s < splits; ++s) top = fmaxf(top, lse[s * HEADS]);
    const int d = threadIdx.x * 4;
    float acc[4] = {0.f, 0.f, 0.f, 0.f}, total = 0.f;
    if (top > -INFINITY) {
        for (i64 s = 0; s < splits; ++s) {
            const float w = exp2f(lse[s * HEADS] - top);
            if (w > 0.f) {
                const float4 v = *reinterpret_cast<const float4*>(part + ((row * splits + s) * HEADS + h) * DV + d);
                total += w;
                acc[0] += w * v.x;
                acc[1] += w * v.y;
                acc[2] += w * v.z;
                acc[3] += w * v.w;
            }
        }
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    bf16* const dst = out + row * out_row + h * out_head + d;
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(acc[0] * inv, acc[1] * inv);
    *reinterpret_cast<__nv_bfloat162*>(dst + 2) = __floats2bfloat162_rn(acc[2] * inv, acc[3] * inv);
}
