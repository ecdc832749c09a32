// dsa.topk: the {{ k }} best of the keys j ≤ position in each row of scores, in ascending key
// order, −1 padded; a row with at most {{ k }} keys gets them all. "Best" is the higher score, then
// the lower index, as the interpreter's `dsa.topk` ranks them; −0.0 and +0.0 are one value (the
// order maps both to the bits of +0.0). The result is a set, so it is written in key order: no
// sort, and the sparse attention that reads it gathers cache rows in address order.
// One block of 1024 threads per row, on the order-preserving u32 of each score:
// 1. radix select from the top: a pass counts the row's values in 2^12, then 2^10 bins of the
//    next bits below those already fixed (a warp adds to each bin it hits once: the keys of a
//    row crowd into few bins) and a block scan finds the bin of the k-th best. Once that bin
//    holds at most {{ cap }} values, they are copied to shared memory and the remaining bits are
//    fixed there, not in the row. This gives the k-th best value T and how many of the keys
//    equal to T make the cut (`ties`);
// 2. one ordered pass writes the keys above T and the first `ties` keys equal to T: a block
//    scan of (above, equal) counts over chunks of 8192 keys places each key at its rank, and
//    the pass ends as soon as k keys are written.
// So a row is read two to four times (from L2 after the first), where a select and a bitonic sort
// of the k best read it six times and synchronised 66 times for the sort (one 32k row: 85 µs).
// Dynamic shared memory: 4096 bins + {{ cap }} candidates, 4 bytes each, within SM120's 99 KiB.
__device__ __forceinline__ unsigned {{ name }}_order(float f) {
    const unsigned u = f == 0.f ? 0u : __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

// Keys each thread loads before it counts them: the loads of a pass are in flight together, where
// one key at a time waited on each load in turn (a pass over one 32k row took about 19 µs).
constexpr int {{ name }}_LOADS = 8;

// The exclusive prefix sum of v over the block, in thread order; `total` gets the sum of all.
__device__ __forceinline__ unsigned {{ name }}_scan(unsigned v, unsigned* warp_sums, unsigned& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned inclusive = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned n = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += n;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        unsigned w = warp_sums[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned n = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += n;
        }
        warp_sums[lane] = w;
    }
    __syncthreads();
    const unsigned before = (warp ? warp_sums[warp - 1] : 0u) + inclusive - v;
    total = warp_sums[31];
    __syncthreads();
    return before;
}

// One radix pass: among the n values get(j) whose bits above shift + width equal prefix's, counts
// each value's `width` bits at `shift`, then moves prefix and want to the bin of the want-th
// largest and returns how many values that bin holds.
template <class Get>
__device__ __forceinline__ unsigned {{ name }}_pass(
    Get get, i64 n, int shift, int width, unsigned& prefix, unsigned& want,
    unsigned* hist, unsigned* warp_sums, unsigned* found)
{
    const int tid = threadIdx.x, lane = tid & 31;
    const int bins = 1 << width, per = (bins + 1023) / 1024;
    for (int i = tid; i < bins; i += 1024) hist[i] = 0u;
    __syncthreads();
    const int top = shift + width;
    const unsigned high = top >= 32 ? 0u : ~0u << top;
    for (i64 j0 = 0; j0 < n; j0 += 1024 * {{ name }}_LOADS) {
        unsigned u[{{ name }}_LOADS];
#pragma unroll
        for (int q = 0; q < {{ name }}_LOADS; ++q) {
            const i64 j = j0 + q * 1024 + tid;
            u[q] = j < n ? get(j) : 0u;
        }
#pragma unroll
        for (int q = 0; q < {{ name }}_LOADS; ++q) {
            const i64 j = j0 + q * 1024 + tid;
            const bool counted = j < n && (u[q] & high) == (prefix & high);
            const unsigned bin = counted ? (u[q] >> shift) & (unsigned)(bins - 1) : 0xffffffffu;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (counted && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
        }
    }
    __syncthreads();
    // Thread t owns the bins t·per … t·per + per − 1 counted from the top, so the scan in thread
    // order counts the values in better bins.
    unsigned mine = 0u;
    for (int q = 0; q < per; ++q) {
        const int b = bins - 1 - (tid * per + q);
        if (b >= 0) mine += hist[b];
    }
    unsigned total;
    unsigned better = {{ name }}_scan(mine, warp_sums, total);
    if (better < want && better + mine >= want) {
        for (int q = 0; q < per; ++q) {
            const int b = bins - 1 - (tid * per + q);
            const unsigned c = hist[b];
            if (better + c >= want) {
                found[0] = prefix | ((unsigned)b << shift);
                found[1] = want - better;
                found[2] = c;
                break;
            }
            better += c;
        }
    }
    __syncthreads();
    prefix = found[0];
    want = found[1];
    return found[2];
}

extern "C" __global__ void __launch_bounds__(1024, 1) {{ name }}(
    i64* __restrict__ out, i64 out_row,
    const float* __restrict__ scores, i64 scores_row,
    const i64* __restrict__ positions, i64 rows)
{
    grid_dependency_control();
    constexpr int K = {{ k }}, CAP = {{ cap }}, CHUNK = 8;
    unsigned* const hist = reinterpret_cast<unsigned*>(dynamic_smem);
    unsigned* const cand = hist + 4096;
    __shared__ unsigned warp_sums[32];
    __shared__ unsigned found[3];
    __shared__ unsigned taken_s;
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const int tid = threadIdx.x, lane = tid & 31;
    const i64 valid = positions[row] + 1;
    const float* s = scores + row * scores_row;
    i64* o = out + row * out_row;
    if (valid <= K) {
        for (int i = tid; i < K; i += 1024) o[i] = i < valid ? i : -1;
        return;
    }

    // 1. The k-th best value T.
    const auto in_row = [s](i64 j) { return {{ name }}_order(s[j]); };
    const auto in_shared = [cand](i64 j) { return cand[j]; };
    unsigned prefix = 0u, want = K;
    int shift = 32;
    bool copied = false;
    unsigned copies = 0u;
    for (int width = 12; shift > 0; width = 10) {
        width = min(width, shift);
        shift -= width;
        const unsigned in_bin = {{ name }}_pass(in_row, valid, shift, width, prefix, want, hist, warp_sums, found);
        if (shift > 0 && in_bin <= CAP) {
            if (tid == 0) taken_s = 0u;
            __syncthreads();
            const unsigned high = ~0u << shift;
            for (i64 j0 = 0; j0 < valid; j0 += 1024 * {{ name }}_LOADS) {
                unsigned u[{{ name }}_LOADS];
#pragma unroll
                for (int q = 0; q < {{ name }}_LOADS; ++q) {
                    const i64 j = j0 + q * 1024 + tid;
                    u[q] = j < valid ? in_row(j) : 0u;
                }
#pragma unroll
                for (int q = 0; q < {{ name }}_LOADS; ++q) {
                    const i64 j = j0 + q * 1024 + tid;
                    const bool take = j < valid && (u[q] & high) == prefix;
                    const unsigned ballot = __ballot_sync(0xffffffffu, take);
                    unsigned base = 0u;
                    if (lane == 0 && ballot) base = atomicAdd(&taken_s, (unsigned)__popc(ballot));
                    base = __shfl_sync(0xffffffffu, base, 0);
                    if (take) cand[base + __popc(ballot & ((1u << lane) - 1u))] = u[q];
                }
            }
            __syncthreads();
            copies = in_bin;
            copied = true;
            break;
        }
    }
    if (copied) {
        while (shift > 0) {
            const int width = min(12, shift);
            shift -= width;
            {{ name }}_pass(in_shared, copies, shift, width, prefix, want, hist, warp_sums, found);
        }
    }
    const unsigned threshold = prefix, ties = want;

    // 2. The keys above T and the first `ties` keys equal to T, each at its rank in key order.
    unsigned above_before = 0u, equal_before = 0u;
    for (i64 c0 = 0; c0 < valid; c0 += 1024 * CHUNK) {
        unsigned u[CHUNK], above = 0u, equal = 0u;
#pragma unroll
        for (int v = 0; v < CHUNK; ++v) {
            const i64 j = c0 + (i64)tid * CHUNK + v;
            u[v] = j < valid ? in_row(j) : 0u;
            above += j < valid && u[v] > threshold;
            equal += j < valid && u[v] == threshold;
        }
        // Both counts of a chunk are at most 8192, so they share one scan in two half-words.
        unsigned total;
        const unsigned before = {{ name }}_scan(above | equal << 16, warp_sums, total);
        unsigned a = above_before + (before & 0xffffu), e = equal_before + (before >> 16);
#pragma unroll
        for (int v = 0; v < CHUNK; ++v) {
            const i64 j = c0 + (i64)tid * CHUNK + v;
            if (j >= valid) break;
            if (u[v] > threshold) {
                o[a + min(e, ties)] = j;
                ++a;
            } else if (u[v] == threshold) {
                if (e < ties) o[a + e] = j;
                ++e;
            }
        }
        above_before += total & 0xffffu;
        equal_before += total >> 16;
        if (above_before + min(equal_before, ties) >= (unsigned)K) break;
    }
}
