// {{ op }}, second kernel: the `splits` partial results of the split attention combined,
// out(h) = Σ_s 2^(lse_s − M) · O_s / Σ_s 2^(lse_s − M) with M the largest lse (base 2), from the
// scratch `part` laid out as the first kernel writes it (O [rows][splits][{{ heads }}][512] f32,
// then lse [rows][splits][{{ heads }}]). One block of 128 threads per (row, head), 4 columns a
// thread. Only the `used` splits that hold keys are read (mla_split.cuh, as the first kernel
// divides them); one whose keys were all hidden has lse −inf and weight 0, and a row without any
// visible key gets zeros.
// One pass over the splits in groups of UNROLL whose loads (lse and O) are all issued before any
// is used, M kept as a running max (the sums rescaled when it grows): the partials sit in L2,
// and a load at a time would pay its latency once per split (64 of them at batch 1). A split
// of lse −inf wrote no O: the bytes read for it are stale and are dropped, not multiplied.
extern "C" __global__ void __launch_bounds__(128, 1) {{ name }}(
    bf16* __restrict__ out, i64 out_row, i64 out_head,
    const float* __restrict__ part, const i64* __restrict__ positions, i64 rows, i64 splits)
{
    grid_dependency_control();
    constexpr int DV = 512, HEADS = {{ heads }}, UNROLL = 16;
    const i64 row = blockIdx.x / HEADS;
    const int h = blockIdx.x % HEADS;
    if (row >= rows) return;
{% include "mla_split.cuh" %}
    const float* const lse = part + rows * splits * HEADS * DV + row * splits * HEADS + h;
    const int d = threadIdx.x * 4;
    const float* const o = part + (row * splits * HEADS + h) * DV + d;
    float acc[4] = {0.f, 0.f, 0.f, 0.f}, total = 0.f, top = -INFINITY;
    for (i64 s0 = 0; s0 < used; s0 += UNROLL) {
        float x[UNROLL];
        float4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const i64 s = s0 + u;
            x[u] = s < used ? lse[s * HEADS] : -INFINITY;
            v[u] = s < used ? __ldcg(reinterpret_cast<const float4*>(o + s * HEADS * DV))
                              : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        float m = top;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) m = fmaxf(m, x[u]);
        if (m == -INFINITY) continue;
        // 0 while nothing has been summed (top −inf).
        const float c = exp2f(top - m);
        total *= c;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] *= c;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (x[u] > -INFINITY) {
                const float w = exp2f(x[u] - m);
                total += w;
                acc[0] += w * v[u].x;
                acc[1] += w * v[u].y;
                acc[2] += w * v[u].z;
                acc[3] += w * v[u].w;
            }
        }
        top = m;
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    bf16* const dst = out + row * out_row + h * out_head + d;
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(acc[0] * inv, acc[1] * inv);
    *reinterpret_cast<__nv_bfloat162*>(dst + 2) = __floats2bfloat162_rn(acc[2] * inv, acc[3] * inv);
}
