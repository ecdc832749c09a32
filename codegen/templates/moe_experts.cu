// moe.experts: y = Σ_j weight_j · down_e(silu(gate_e x) ⊙ up_e x), e = expert j of the token, over
// {{ top_k }} experts of {{ inter }} × {{ dim }}. Baseline: one block of 1024 threads per token, looping
// over its experts; GEMVs one warp per output row (coalesced weight rows, a warp sum each), all in
// f32. Dynamic shared memory holds the activation ({{ inter }} f32), the output accumulator
// ({{ dim }} f32) and the token ({{ dim }} × {{ x_t }}): {{ shared }} bytes, which glmc holds to SM120's
// 99 KiB. No scratch memory: nothing outside the block is written but y.
extern "C" __global__ void __launch_bounds__(1024) {{ name }}(
    {{ y_t }}* __restrict__ y, i64 y_row,
    const {{ x_t }}* __restrict__ x, i64 x_row,
    const {{ w_t }}* __restrict__ weights, i64 weights_row,
    const i64* __restrict__ experts, i64 experts_row,
    const {{ gate_t }}* __restrict__ gate,
    const {{ up_t }}* __restrict__ up,
    const {{ down_t }}* __restrict__ down, i64 rows)
{
    grid_dependency_control();
    constexpr int D = {{ dim }}, I = {{ inter }}, TOP_K = {{ top_k }}, E = {{ experts }};
    constexpr int WARPS = 32;
    float* const hs = reinterpret_cast<float*>(dynamic_smem);  // [I]
    float* const ys = hs + I;                                   // [D]
    {{ x_t }}* const xs = reinterpret_cast<{{ x_t }}*>(ys + D);  // [D]
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int d = tid; d < D; d += 1024) {
        xs[d] = x[row * x_row + d];
        ys[d] = 0.f;
    }
    __syncthreads();
    for (int j = 0; j < TOP_K; ++j) {
        const i64 e = experts[row * experts_row + j];
        const float wj = ld(weights + row * weights_row + j);
        if (e < 0 || e >= E) {
            // An expert id outside the table: the fault shows as NaN, not as a plausible value.
            for (int d = tid; d < D; d += 1024) ys[d] = nan_f32();
            break;
        }
        const {{ gate_t }}* g = gate + e * I * D;
        const {{ up_t }}* u = up + e * I * D;
        for (int i = warp; i < I; i += WARPS) {
            float a = 0.f, b = 0.f;
            for (int d = lane; d < D; d += 32) {
                const float xv = ld(&xs[d]);
                a += ld(g + (i64)i * D + d) * xv;
                b += ld(u + (i64)i * D + d) * xv;
            }
            a = warp_sum(a);
            b = warp_sum(b);
            if (lane == 0) hs[i] = silu(a) * b;
        }
        __syncthreads();
        const {{ down_t }}* dn = down + e * D * I;
        for (int d = warp; d < D; d += WARPS) {
            float a = 0.f;
            for (int i = lane; i < I; i += 32) a += ld(dn + (i64)d * I + i) * hs[i];
            a = warp_sum(a);
            if (lane == 0) ys[d] += wj * a;
        }
        __syncthreads();
    }
    __syncthreads();
    for (int d = tid; d < D; d += 1024) st(y + row * y_row + d, ys[d]);
}
