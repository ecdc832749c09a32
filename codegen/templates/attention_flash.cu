// {{ op }} (dense, expanded), flash-style on the tensor cores: logit(j) = scale · (q1·k1(j) +
// q2·k2(j)) over {{ d1 }} + {{ d2 }} dims (k1 per head, k2 the one rope key all heads share),
// output Σ_j softmax(logit)_j · v(j) over {{ dv }} dims, for the keys j ≤ position of each row (a
// chunked prefill's rows sit after a cache of earlier keys; positions say where).
//
// Tiling: one block of 4 warps per head and tile of 64 query rows, each warp 16 rows; key tiles
// of 64 stream through. Per key tile a warp computes S = Q·Kᵀ (16 × 64, f32 in mma.sync
// m16n8k16), masks j > position, runs the online softmax on its rows in registers (a row's four
// lanes agree through two shuffles), rounds P to bf16 as the A operand and adds P·V into its
// 16 × {{ dv }} f32 accumulator ({{ dv }} / 2 registers a thread: the reason a warp holds 16 rows,
// not 32). The row sum l adds up the rounded P, so the weights the values get sum to one.
//
// Shared memory, dynamic: Q (64 × {{ d1 }}+{{ d2 }}), one K tile (64 × the same) and one V tile
// (64 × {{ dv }}), bf16, {{ smem_kib }} KiB, within SM120's 99 KiB. Rows whose length is a multiple
// of 64 elements are XOR-swizzled by 16-byte chunk (chunk ^ row % 8), others padded by a chunk,
// so the eight rows an ldmatrix phase reads land on distinct banks. Q stays in shared memory, not
// registers: with the accumulator it would not fit 255 registers. There is room for one K and one
// V tile, not two of each, so the copies overlap as in FlashAttention-2: the next K tile is in
// flight while P·V runs, the next V tile while Q·Kᵀ runs.
//
// Blocks take heads fastest, then row tiles from the last: under the causal mask late rows see
// the most keys, and starting them first shortens the tail. Rows past `rows` read as zeros,
// see no key and are not stored; a block stops at the tile of the largest position among its
// rows, and keys past it land as zeros (a V row of garbage times a zero weight would be NaN).
namespace {{ name }}_ {
constexpr int D1 = {{ d1 }}, D2 = {{ d2 }}, D = D1 + D2, DV = {{ dv }}, HEADS = {{ heads }};
constexpr int BM = 64, BN = 64, THREADS = 128;
constexpr int QC = D / 8, Q1C = D1 / 8, VC = DV / 8;  // 16-byte chunks a row

// Element offset of chunk `c` of row `r` in a tile of rows of C chunks.
template <int C> __device__ __forceinline__ int at(int r, int c) {
    if constexpr (C % 8 == 0) return (r * C + (c ^ (r & 7))) * 8;
    else return (r * (C + 1) + c) * 8;
}
template <int C> __host__ __device__ constexpr int tile_elems(int rows) { return rows * (C % 8 == 0 ? C : C + 1) * 8; }

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&p);
}
}  // namespace {{ name }}_

extern "C" __global__ void __launch_bounds__(128, 1) {{ name }}(
    {{ out_t }}* __restrict__ out, i64 out_row, i64 out_head,
    const bf16* __restrict__ q1, i64 q1_row, i64 q1_head,
    const bf16* __restrict__ q2, i64 q2_row, i64 q2_head,
    const bf16* __restrict__ k1, i64 k1_key, i64 k1_head,
    const bf16* __restrict__ k2, i64 k2_key,
    const bf16* __restrict__ v, i64 v_key, i64 v_head,
    const i64* __restrict__ positions, i64 rows, float scale{%- if slotted %},
    const i64* __restrict__ cache_slot, i64 k1_slot, i64 k2_slot, i64 v_slot{%- endif %})
{
    grid_dependency_control();
{%- if slotted %}
    // A prefill's caches are those of slot cache_slot[0]: each cache starts that many slots in
    // (0 apart for one held in the arena).
    k1 += cache_slot[0] * k1_slot;
    k2 += cache_slot[0] * k2_slot;
    v += cache_slot[0] * v_slot;
{%- endif %}
    using namespace {{ name }}_;
    bf16* const sq = reinterpret_cast<bf16*>(dynamic_smem);
    bf16* const sk = sq + tile_elems<QC>(BM);
    bf16* const sv = sk + tile_elems<QC>(BN);
    __shared__ i64 pos_s[BM];
    __shared__ i64 last_s[2];

    const i64 tiles = (rows + BM - 1) / BM;
    const int h = blockIdx.x % HEADS;
    const i64 rt = blockIdx.x / HEADS;
    if (rt >= tiles) return;
    const i64 m0 = (tiles - 1 - rt) * BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;

    if (tid < BM) {
        i64 p = m0 + tid < rows ? positions[m0 + tid] : -1;
        pos_s[tid] = p;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) p = max(p, __shfl_xor_sync(0xffffffffu, p, o));
        if (lane == 0) last_s[warp] = p;
    }
    for (int i = tid; i < BM * QC; i += THREADS) {
        const int r = i / QC, c = i % QC;
        const i64 row = m0 + r;
        const bool ok = row < rows;
        const bf16* src = c < Q1C ? q1 + row * q1_row + h * q1_head + c * 8
                                  : q2 + row * q2_row + h * q2_head + (c - Q1C) * 8;
        cp_async16(sq + at<QC>(r, c), ok ? src : q1, ok);
    }
    __syncthreads();
    const i64 last = max(last_s[0], last_s[1]);
    const int key_tiles = (int)(last / BN + 1);

    auto load_k = [&](int kt) {
        for (int i = tid; i < BN * QC; i += THREADS) {
            const int r = i / QC, c = i % QC;
            const i64 j = (i64)kt * BN + r;
            const bool ok = j <= last;
            const bf16* src = c < Q1C ? k1 + j * k1_key + h * k1_head + c * 8 : k2 + j * k2_key + (c - Q1C) * 8;
            cp_async16(sk + at<QC>(r, c), ok ? src : k1, ok);
        }
    };
    auto load_v = [&](int kt) {
        for (int i = tid; i < BN * VC; i += THREADS) {
            const int r = i / VC, c = i % VC;
            const i64 j = (i64)kt * BN + r;
            const bool ok = j <= last;
            cp_async16(sv + at<VC>(r, c), ok ? v + j * v_key + h * v_head + c * 8 : v, ok);
        }
    };

    const int r0 = warp * 16 + g;
    const i64 p0 = pos_s[r0], p1 = pos_s[r0 + 8];
    const float scale_log2 = scale * 1.4426950408889634f;
    float o[DV / 8][4];
#pragma unroll
    for (int n = 0; n < DV / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    load_k(0);
    cp_async_commit();
    load_v(0);
    cp_async_commit();
    for (int kt = 0; kt < key_tiles; ++kt) {
        // Q and K tile kt have landed (V tile kt may still be in flight).
        cp_async_wait<1>();
        __syncthreads();
        float s[BN / 8][4];
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned a[4];
            ldmatrix_x4(a, sq + at<QC>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
            for (int nj = 0; nj < BN / 16; ++nj) {
                unsigned b[4];
                ldmatrix_x4(b, sk + at<QC>(nj * 16 + (lane >> 4) * 8 + (lane & 7), kk * 2 + ((lane >> 3) & 1)));
                mma_bf16(s[2 * nj], a, b[0], b[1]);
                mma_bf16(s[2 * nj + 1], a, b[2], b[3]);
            }
        }
        // Every warp is done with K tile kt: the next one may land in its place.
        __syncthreads();
        if (kt + 1 < key_tiles) load_k(kt + 1);
        cp_async_commit();

        // Accumulator e of an 8-key tile is row g + (e / 2) * 8, key t4 * 2 + e % 2.
        const i64 j0 = (i64)kt * BN;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 j = j0 + n * 8 + t4 * 2 + (e & 1);
                s[n][e] = j <= (e < 2 ? p0 : p1) ? s[n][e] * scale_log2 : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
            }
        float base[2], corr[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            // A row that has seen no key yet keeps a zero base, so exp2 of −inf gives 0, not NaN.
            base[i] = mx[i] == -INFINITY ? 0.f : mx[i];
            corr[i] = exp2f(m[i] - base[i]);
            m[i] = mx[i];
            l[i] *= corr[i];
        }
#pragma unroll
        for (int n = 0; n < DV / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[n][e] *= corr[e >> 1];
        unsigned pa[BN / 16][4];
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
            const unsigned lo = pack_bf16(exp2f(s[n][0] - base[0]), exp2f(s[n][1] - base[0]));
            const unsigned hi = pack_bf16(exp2f(s[n][2] - base[1]), exp2f(s[n][3] - base[1]));
            const __nv_bfloat162 rl = *reinterpret_cast<const __nv_bfloat162*>(&lo);
            const __nv_bfloat162 rh = *reinterpret_cast<const __nv_bfloat162*>(&hi);
            l[0] += __low2float(rl) + __high2float(rl);
            l[1] += __low2float(rh) + __high2float(rh);
            pa[n / 2][(n & 1) * 2] = lo;
            pa[n / 2][(n & 1) * 2 + 1] = hi;
        }

        // V tile kt has landed (K tile kt + 1 may still be in flight).
        cp_async_wait<1>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
            for (int nd = 0; nd < DV / 16; ++nd) {
                unsigned b[4];
                ldmatrix_x4_trans(b, sv + at<VC>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, nd * 2 + (lane >> 4)));
                mma_bf16(o[2 * nd], pa[kk], b[0], b[1]);
                mma_bf16(o[2 * nd + 1], pa[kk], b[2], b[3]);
            }
        // Every warp is done with V tile kt.
        __syncthreads();
        if (kt + 1 < key_tiles) load_v(kt + 1);
        cp_async_commit();
    }

    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        inv[i] = l[i] > 0.f ? 1.f / l[i] : 0.f;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const i64 row = m0 + r0 + half * 8;
        if (row >= rows) continue;
        {{ out_t }}* const orow = out + row * out_row + h * out_head + t4 * 2;
#pragma unroll
        for (int n = 0; n < DV / 8; ++n) {
            st(orow + n * 8, o[n][half * 2] * inv[half]);
            st(orow + n * 8 + 1, o[n][half * 2 + 1] * inv[half]);
        }
    }
}
