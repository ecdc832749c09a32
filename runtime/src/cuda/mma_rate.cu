// The bf16 `mma.sync` m16n8k16 ceiling of the GPU (runtime/src/cuda/ceiling.rs): every warp
// runs `iters` rounds of 8 independent MMAs from registers, so nothing but the tensor cores
// limits it. The same instruction the generated GEMMs use, so the rate is their ceiling.
extern "C" __global__ void glmc_mma_rate(float* sink, long long iters, int write) {
    unsigned a0 = threadIdx.x, a1 = a0 ^ 1u, a2 = a0 ^ 2u, a3 = a0 ^ 3u;
    unsigned b0 = blockIdx.x, b1 = b0 ^ 1u;
    float d[8][4];
    for (int m = 0; m < 8; ++m) {
        for (int r = 0; r < 4; ++r) {
            d[m][r] = 0.0f;
        }
    }
    for (long long i = 0; i < iters; ++i) {
#pragma unroll
        for (int m = 0; m < 8; ++m) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                : "+f"(d[m][0]), "+f"(d[m][1]), "+f"(d[m][2]), "+f"(d[m][3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
    }
    // `write` is 0 at run time: the results are never stored, but the compiler cannot know.
    if (write) {
        float s = 0.0f;
        for (int m = 0; m < 8; ++m) {
            s += d[m][0] + d[m][1] + d[m][2] + d[m][3];
        }
        sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
    }
}
