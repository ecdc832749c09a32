// Kernels that only read, the ceiling a decode GEMM or the absorbed attention is held against
// (runtime/src/cuda/ceiling.rs): the time any kernel needs to bring the same bytes in under the
// same protocol (the same launch, the same graph, the same programmatic dependency on the kernel
// before), with no arithmetic to hide. Every thread folds what it reads with XOR and stores the
// fold only if it equals `never`, which the host picks so that it does not: the loads cannot be
// elided and nothing is written. Every parameter is 8 bytes, so the host passes an array of u64.
//
// Compiled after glmc's codegen/templates/common.cuh (`ceiling::read_source`), so the probes
// wait on the kernel before as glmc's kernels do (`grid_dependency_control`) and issue their
// loads before the wait as the skinny GEMM does (`ld_early16`).
typedef unsigned long long u64;

// The skinny GEMM's steady-state load (`ld_stream16` in common.cuh, without its L2 prefetch
// hint: a warp here reads 512 contiguous bytes a load), but `volatile`, so that the loads issue
// in program order: a slot's next load right after its previous one arrived (DEPTH loads in
// flight a thread, rolling).
__device__ __forceinline__ uint4 ld_read16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned fold16(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Block b of B reads vectors [vecs·b/B, vecs·(b+1)/B): contiguous spans differing by at most
// one vector, consecutive threads on consecutive vectors (ceiling.rs's `block_span`).
__device__ __forceinline__ i64 span_begin(i64 vecs, i64 block) { return vecs * block / gridDim.x; }

// One decode GEMM's weight: `vecs` 16-byte vectors from `buf`, read once. As the skinny GEMM
// means to, the first DEPTH loads go out before the wait (a weight is never written by a kernel).
template <int DEPTH>
__device__ __forceinline__ void read_stream(const uint4* buf, i64 vecs, unsigned* sink, u64 never) {
    const i64 stride = blockDim.x, end = span_begin(vecs, blockIdx.x + 1);
    i64 i = span_begin(vecs, blockIdx.x) + threadIdx.x;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 v[DEPTH];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
        v[d] = i + d * stride < end ? ld_early16(buf + i + d * stride) : zero;
    }
    grid_dependency_control();
    unsigned fold = 0;
    // Not unrolled further, so the registers follow DEPTH (sm_120a otherwise unrolls it: 70
    // registers at DEPTH 4, too many for 8 blocks an SM).
#pragma unroll 1
    for (i += DEPTH * stride; i < end; i += DEPTH * stride) {
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
            fold ^= fold16(v[d]);
            v[d] = i + d * stride < end ? ld_read16(buf + i + d * stride) : zero;
        }
    }
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
        fold ^= fold16(v[d]);
    }
    if (fold == never) {
        sink[blockIdx.x * blockDim.x + threadIdx.x] = fold;
    }
}

// The absorbed attention's reads: for each query row and entry of its top-k list naming cache
// row j ≥ 0, the 1024 bytes at k1 + row·k1_seq + j·k1_key and the 128 at k2 + row·k2_seq +
// j·k2_key. Blocks split the rows' entries as the stream splits vectors; eight lanes read an
// entry, lane l its k1 vectors l, l + 8, … (a load of a warp: four entries' 128 contiguous
// bytes) and its k2 vector l, so a thread looks an entry up once for 9 loads. Nothing can be
// read before the wait: every address comes from the top-k list, which the kernel before writes.
struct Gather {
    const i64* topk;
    i64 topk_row, rows, keys;
    const char* k1;
    i64 k1_seq, k1_key;
    const char* k2;
    i64 k2_seq, k2_key;
};

constexpr int LANES = 8, PARTS = 1024 / 16 / LANES + 1;

// The cache row entry e (row-major over rows × keys) names; −1 past `end` (cache rows are below
// 2^31, entries below 2^31: ceiling.rs checks). A plain load, after the wait.
__device__ __forceinline__ int cache_row(const Gather& p, unsigned e, unsigned end) {
    const unsigned row = e / (unsigned)p.keys;
    return e < end ? (int)p.topk[row * p.topk_row + (e - row * (unsigned)p.keys)] : -1;
}

// Entry e's PARTS loads for this lane, into v; zeros where it names no row.
__device__ __forceinline__ void read_entry(const Gather& p, unsigned e, int j, uint4 (&v)[PARTS]) {
    const unsigned row = e / (unsigned)p.keys, lane = threadIdx.x % LANES;
    const char* k1 = p.k1 + row * p.k1_seq + j * p.k1_key + lane * 16;
    const char* k2 = p.k2 + row * p.k2_seq + j * p.k2_key + lane * 16;
#pragma unroll
    for (int m = 0; m < PARTS; ++m) {
        const char* at = m + 1 < PARTS ? k1 + m * LANES * 16 : k2;
        v[m] = j >= 0 ? ld_read16(at) : make_uint4(0, 0, 0, 0);
    }
}

// DEPTH entries in flight a thread, rolling as the stream's loads, each one's cache row looked
// up a round ahead so that a thread waits only for its data.
template <int DEPTH>
__device__ __forceinline__ void read_gather(const Gather& p, unsigned* sink, u64 never) {
    grid_dependency_control();
    const i64 entries = p.rows * p.keys;
    const unsigned stride = blockDim.x / LANES, end = (unsigned)span_begin(entries, blockIdx.x + 1);
    unsigned e = (unsigned)span_begin(entries, blockIdx.x) + threadIdx.x / LANES;
    uint4 v[DEPTH][PARTS];
    int j[DEPTH];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
        j[d] = cache_row(p, e + d * stride, end);
    }
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
        read_entry(p, e + d * stride, j[d], v[d]);
        j[d] = cache_row(p, e + (DEPTH + d) * stride, end);
    }
    unsigned fold = 0;
#pragma unroll 1
    for (e += DEPTH * stride; e < end; e += DEPTH * stride) {
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
#pragma unroll
            for (int m = 0; m < PARTS; ++m) {
                fold ^= fold16(v[d][m]);
            }
            read_entry(p, e + d * stride, j[d], v[d]);
            j[d] = cache_row(p, e + (DEPTH + d) * stride, end);
        }
    }
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
#pragma unroll
        for (int m = 0; m < PARTS; ++m) {
            fold ^= fold16(v[d][m]);
        }
    }
    if (fold == never) {
        sink[blockIdx.x * blockDim.x + threadIdx.x] = fold;
    }
}

// The stream's DEPTH counts loads, the gather's entries of PARTS loads each (ceiling.rs's
// STREAM_DEPTHS and GATHER_DEPTHS).
#define READ_STREAM(DEPTH)                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                           \
        glmc_read_stream_##DEPTH(const uint4* buf, i64 vecs, unsigned* sink, u64 never) {        \
        read_stream<DEPTH>(buf, vecs, sink, never);                                              \
    }
#define READ_GATHER(DEPTH)                                                                       \
    extern "C" __global__ void __launch_bounds__(256) glmc_read_gather_##DEPTH(                 \
        const i64* topk, i64 topk_row, i64 rows, i64 keys, const char* k1, i64 k1_seq,           \
        i64 k1_key, const char* k2, i64 k2_seq, i64 k2_key, unsigned* sink, u64 never) {         \
        read_gather<DEPTH>({topk, topk_row, rows, keys, k1, k1_seq, k1_key, k2, k2_seq, k2_key}, \
                           sink, never);                                                         \
    }

READ_STREAM(4)
READ_STREAM(8)
READ_STREAM(16)
READ_GATHER(1)
READ_GATHER(2)
