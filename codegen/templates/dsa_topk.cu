// dsa.topk: the {{ k }} best of the keys j ≤ position in each row of scores, best first (higher
// score, then lower index), −1 padded; a row with at most {{ k }} keys gets them all in ascending
// order. One block of 1024 threads per row:
// 1. radix select on the order-preserving u32 of each score, 8 bits a pass (4 passes over the
//    row, a 256-bin shared histogram each, the bin of the k-th best found by a parallel scan),
//    finds the k-th best value T and how many of the keys equal to T make the cut;
// 2. one pass gathers the keys above T, then the first of those equal to T in index order
//    (ranked by warp ballots), into shared memory;
// 3. a bitonic sort of {{ pow2 }} 64-bit keys (score, ~index) in shared memory orders them.
// Ties: keys of equal score are ranked by lower index, both where T is cut (the first of the
// keys equal to T in index order make it) and in the sort (the low word is ~index), as the
// interpreter's `dsa.topk` does; −0.0 and +0.0 are one value there too (the order maps both to
// the bits of +0.0).
// Work per row: O(4·t/1024 + k·log²k/1024) steps, so 32k keys and k = 2048 stay in the
// microseconds: each pass reads the row once (128 KiB at 32k keys, from L2 after the first), a
// warp adds to each histogram bin it hits once (keys of a row crowd into few bins; with one
// shared atomic per key, one 32k row took 79 µs on an H200), and the
// bin search is a scan of 8 warps, not up to 256 dependent shared-memory reads of one thread
// while the other 1023 wait. Shared memory is {{ pow2 }} × 8 bytes + 1 KiB histogram (SM120 allows 99 KiB).
__device__ __forceinline__ unsigned {{ name }}_order(float f) {
    const unsigned u = f == 0.f ? 0u : __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

extern "C" __global__ void __launch_bounds__(1024, 1) {{ name }}(
    i64* __restrict__ out, i64 out_row,
    const float* __restrict__ scores, i64 scores_row,
    const i64* __restrict__ positions, i64 rows)
{
    constexpr int K = {{ k }}, P2 = {{ pow2 }}, T = 1024;
    __shared__ unsigned long long keys[P2];
    __shared__ unsigned hist[256];
    __shared__ unsigned warp_counts[32];
    __shared__ unsigned prefix_s, want_s, taken_s;
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const i64 valid = positions[row] + 1;
    const float* s = scores + row * scores_row;
    i64* o = out + row * out_row;
    if (valid <= K) {
        for (int i = tid; i < K; i += T) o[i] = i < valid ? i : -1;
        return;
    }

    // 1. The k-th best value, one byte at a time from the top.
    unsigned prefix = 0u, want = K;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += T) hist[i] = 0u;
        __syncthreads();
        const unsigned high = shift == 24 ? 0u : ~0u << (shift + 8);
        // Scores of one row share their high bytes (the first pass sees a handful of exponents),
        // so one atomic per key would serialise on a few bins: the lanes of a warp that hit one
        // bin add their count once (256 stands for "not counted").
        for (i64 j0 = 0; j0 < valid; j0 += T) {
            const i64 j = j0 + tid;
            const unsigned u = j < valid ? {{ name }}_order(s[j]) : 0u;
            const bool counted = j < valid && (u & high) == (prefix & high);
            const unsigned bin = counted ? (u >> shift) & 255u : 256u;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (counted && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
        }
        __syncthreads();
        // The bin holding the want-th best: thread i takes bin 255 − i, and a scan over the 8
        // warps counts the keys in better bins; one thread finds want among its own.
        unsigned count = 0u, better = 0u;
        if (tid < 256) {
            count = hist[255 - tid];
            better = count;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned n = __shfl_up_sync(0xffffffffu, better, o);
                if (lane >= o) better += n;
            }
            if (lane == 31) warp_counts[warp] = better;
            better -= count;
        }
        __syncthreads();
        if (tid < 256) {
            for (int w = 0; w < warp; ++w) better += warp_counts[w];
            if (better < want && better + count >= want) {
                prefix_s = prefix | ((unsigned)(255 - tid) << shift);
                want_s = want - better;
            }
        }
        __syncthreads();
        prefix = prefix_s;
        want = want_s;
    }
    const unsigned threshold = prefix;
    const unsigned ties = want;

    // 2. Keys above the threshold in any order; ties in index order until `ties` are taken.
    if (tid == 0) taken_s = 0u;
    __syncthreads();
    for (i64 j0 = 0; j0 < valid; j0 += T) {
        const i64 j = j0 + tid;
        const unsigned u = j < valid ? {{ name }}_order(s[j]) : 0u;
        const bool take = j < valid && u > threshold;
        // One atomic per warp for its keys above T, each lane's slot its rank among them.
        const unsigned ballot = __ballot_sync(0xffffffffu, take);
        unsigned base = 0u;
        if (lane == 0 && ballot) base = atomicAdd(&taken_s, (unsigned)__popc(ballot));
        base = __shfl_sync(0xffffffffu, base, 0);
        if (take) keys[base + __popc(ballot & ((1u << lane) - 1u))] = ((unsigned long long)u << 32) | ~(unsigned)j;
    }
    __syncthreads();
    const unsigned above = taken_s;
    unsigned tie_base = 0u;
    for (i64 j0 = 0; j0 < valid && tie_base < ties; j0 += T) {
        const i64 j = j0 + tid;
        const bool tie = j < valid && {{ name }}_order(s[j]) == threshold;
        const unsigned ballot = __ballot_sync(0xffffffffu, tie);
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        unsigned before = tie_base, total = 0u;
        for (int w = 0; w < 32; ++w) {
            if (w < warp) before += warp_counts[w];
            total += warp_counts[w];
        }
        const unsigned rank = before + __popc(ballot & ((1u << lane) - 1u));
        if (tie && rank < ties) keys[above + rank] = ((unsigned long long)threshold << 32) | ~(unsigned)j;
        tie_base += total;
        __syncthreads();
    }
    for (int i = K + tid; i < P2; i += T) keys[i] = 0ull;
    __syncthreads();

    // 3. Bitonic sort, descending.
    for (int size = 2; size <= P2; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < P2; i += T) {
                const int partner = i ^ stride;
                if (partner > i) {
                    const bool descending = (i & size) == 0;
                    const unsigned long long a = keys[i], b = keys[partner];
                    if ((a < b) == descending) { keys[i] = b; keys[partner] = a; }
                }
            }
            __syncthreads();
        }
    }
    for (int i = tid; i < K; i += T) o[i] = (i64)~(unsigned)(keys[i] & 0xffffffffull);
}
