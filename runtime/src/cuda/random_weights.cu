// The GPU half of runtime/src/random_weights.rs, whose module doc defines the generator: the same
// integer hashing, exact conversions and two correctly rounded f32 operations (__fmul_rn and
// __fadd_rn, which nvcc never contracts into an fma), so every value is bit-identical to the
// interpreter's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// Matches `Geometry` in random_fill.rs: a box of the output and where it reads the leaf.
struct Geometry {
    long long rank;
    long long start[8];
    long long len[8];
    long long out_stride[8];
    long long leaf_stride[8];
};

__device__ __forceinline__ unsigned long long glmc_mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// Fills the `count` elements of one piece: element t of the box (row-major over its lengths) is
// leaf element `base + Σ c[k]·leaf_stride[k]`, written at `Σ c[k]·out_stride[k]` of `out`.
// stored: 0 f32, 1 bf16, 2 f16 (the checkpoint's rounding); out_bf16: the weight's dtype.
extern "C" __global__ void glmc_random_weights(void* out, Geometry g, long long base,
                                               long long count, unsigned long long key,
                                               float offset, float amplitude, int stored,
                                               int out_bf16) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < count; t += step) {
        long long rem = t, at = 0, leaf = base;
        for (int k = (int)g.rank - 1; k >= 0; --k) {
            long long c = g.start[k] + rem % g.len[k];
            rem /= g.len[k];
            at += c * g.out_stride[k];
            leaf += c * g.leaf_stride[k];
        }
        unsigned long long bits = glmc_mix(key + (unsigned long long)leaf * 0x9E3779B97F4A7C15ULL);
        float u = __fmul_rn((float)((int)(bits >> 40) - 8388608), 1.0f / 8388608.0f);
        float v = __fadd_rn(offset, __fmul_rn(amplitude, u));
        if (stored == 1) {
            v = __bfloat162float(__float2bfloat16_rn(v));
        } else if (stored == 2) {
            v = __half2float(__float2half_rn(v));
        }
        if (out_bf16) {
            ((__nv_bfloat16*)out)[at] = __float2bfloat16_rn(v);
        } else {
            ((float*)out)[at] = v;
        }
    }
}
