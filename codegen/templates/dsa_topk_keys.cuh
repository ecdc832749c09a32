{#- The device functions both dsa.topk kernels share (prefixed by the kernel's name): a score's
    order-preserving u32 and back, its canonical form, a block's exclusive scan, the radix
    narrowing of the cut's range, and the ordered write's per-slot steps. #}
// The order-preserving u32 of a canonical score, and back.
__device__ __forceinline__ unsigned {{ name }}_order(float f) {
    const unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

__device__ __forceinline__ float {{ name }}_value(unsigned o) {
    return __uint_as_float((o & 0x80000000u) ? o & 0x7fffffffu : ~o);
}

// −0.0 as +0.0 and NaN as −∞, so that float comparisons and the order agree everywhere.
__device__ __forceinline__ float {{ name }}_canon(float f) {
    return __uint_as_float(f != f ? 0xff800000u : f == 0.f ? 0u : __float_as_uint(f));
}

// The exclusive prefix sum of v over the block, in thread order; `total` gets the sum of all. One
// barrier: `sums` may be written again only after every thread has passed a later one.
__device__ __forceinline__ unsigned {{ name }}_scan(unsigned v, unsigned* sums, unsigned& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned inclusive = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned n = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += n;
    }
    if (lane == 31) sums[warp] = inclusive;
    __syncthreads();
    unsigned w = lane < (int)(blockDim.x >> 5) ? sums[lane] : 0u;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned n = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += n;
    }
    total = __shfl_sync(0xffffffffu, w, 31);
    const unsigned below = __shfl_sync(0xffffffffu, w, warp ? warp - 1 : 0);
    return (warp ? below : 0u) + inclusive - v;
}

// The range [lo, hi] of order-preserving u32s that holds the cut, narrowed pass by pass: a pass
// counts the range's values in at most 1024 bins of 2^shift values each (`open`), then keeps the
// bin the pick chose (`keep`), until one value is left.
struct {{ name }}_Range {
    unsigned lo, hi;
    int shift;

    // Starts a pass; returns its number of bins.
    __device__ __forceinline__ int open() {
        shift = max(0, 32 - __clz((int)(hi - lo)) - 10);
        return (int)((hi - lo) >> shift) + 1;
    }

    __device__ __forceinline__ bool holds(unsigned u) const { return u >= lo && u <= hi; }

    __device__ __forceinline__ unsigned bin(unsigned u) const { return (u - lo) >> shift; }

    // sel = {bin, values in better bins, ..} from the pick: the range becomes that bin and `want`
    // counts the values still wanted within it.
    __device__ __forceinline__ void keep(const unsigned* sel, unsigned& want) {
        const unsigned base = lo + (sel[0] << shift);
        want -= sel[1];
        hi = base + min(hi - base, (1u << shift) - 1u);
        lo = base;
    }
};

// The write's per-slot steps for key j of score f: count the slot's keys
// above t and equal to t in this warp, then (with `at` the counts before the warp's slot) write
// this key if it is chosen.
struct {{ name }}_Cut {
    float t;
    unsigned ties, above, equal;
    i64* o;

    __device__ __forceinline__ void count(float f, bool in, unsigned* at) const {
        const unsigned a = __ballot_sync(0xffffffffu, in && f > t);
        const unsigned e = __ballot_sync(0xffffffffu, in && f == t);
        if ((threadIdx.x & 31) == 0) *at = __popc(a) | __popc(e) << 16;
    }

    __device__ __forceinline__ void place(float f, bool in, unsigned at, int j) const {
        const unsigned lower = (1u << (threadIdx.x & 31)) - 1u;
        const unsigned a = __ballot_sync(0xffffffffu, in && f > t);
        const unsigned e = __ballot_sync(0xffffffffu, in && f == t);
        const unsigned ab = above + (at & 0xffffu) + __popc(a & lower);
        const unsigned eb = equal + (at >> 16) + __popc(e & lower);
        if (in && f > t) o[ab + min(eb, ties)] = j;
        else if (in && f == t && eb < ties) o[ab + eb] = j;
    }
};
