// {{ op }} on the tensor cores: absorbed MLA over the latent cache, {{ heads }} heads of 512
// latent + 64 rope dims, bf16 in, f32 accumulation (mma.sync m16n8k16, the MMA SM120 has).
// logit(h, j) = scale · [q1|q2](h) · [c|kpe](j), out(h) = Σ_j softmax_j · c(j), over the keys
// j ≤ position{% if sparse %} that the row's {{ topk }} top-k entries name (−1 and entries past
// the position skipped; a row whose context holds at most {{ dense_until }} keys sees all of them,
// the dense_until rule){% endif %}.
//
// Block = (query row, group of {{ hg }} heads, context split); blockIdx runs over the groups
// first, so the blocks that share a row's latent rows run side by side and the cache crosses
// DRAM once (the other groups read it from L2). Keys go by in tiles of BN = 32 through a
// two-stage cp.async ring; each key's 576 values are loaded once per block and serve every head
// of the group as the key (S = Q·Kᵀ) and its first 512 as the value (O += P·V).
//
// The ring is refilled at the end of a tile, not at the start of the next: a block then waits
// with two tiles (72 KiB) on their way rather than one, and the top-k entry of a key is read a
// tile before its copy is issued, so a tile's time is about (gather latency + compute) / 2
// instead of entry latency + gather latency. At ≤ 128 registers an H200 SM holds two blocks,
// up to 144 KiB in flight: 132 SMs × ~100 KiB over a ~2 µs loaded latency is above the copy
// bandwidth, which is what the 8-head (bandwidth-bound) case needs.
//
// Why 16 heads per block: the Q tile is one m16 MMA tile of query rows (16 × 576 bf16 = 18 KiB)
// and a key tile is 32 × 576 bf16 = 36 KiB a stage, so Q + two stages + the score and
// probability tiles take 96.8 KiB, under SM120's 99 KiB. FlashMLA's 64 heads per block would hold
// a 72 KiB Q tile and leave no room for a pipelined key tile; 32 heads would fit only with
// 16-key stages, halving the bytes in flight per block. With 8 heads (GLM-5 at TP=8) the m16 tile
// is half empty: that kernel is bound by the cache's bytes, not the MMAs. At 64 heads it is
// bound by shared-memory reads: a 32-key tile costs a block 296 ldmatrix.x4 (216 in S, where
// each of the four key-quarter warps re-reads its half of Q), ~1.2k cycles of the SM's 128 B
// a cycle against ~400 of MMAs, and four blocks read each key. Fewer reads need the Q fragments
// in registers or 32-64 heads a block, both past the 128 registers that fit two blocks an SM.
//
// 8 warps. S: warp w computes keys (w % 4)·8.. over dims (w / 4)·288.., the two halves summed in
// shared memory. Softmax: 16 threads per head row, online in f32 in base 2 (the scale carries
// log2 e). O: warp w owns latent columns w·64.. of all 16 rows (8 m16n8 accumulators), rescaled
// by the row's correction each tile. P is rounded to bf16 for the MMA while the row sums use
// the f32 values, and the dots are summed in MMA order: the bits differ from the interpreter's
// f64 sums, within bf16 output rounding.
//
// Splits: tile range [0, ceil(keys / 32)) divided evenly among `splits` blocks of the row, the
// count read from the position on the device, so the grid depends on the row count alone (one
// CUDA graph serves every decode step).{% if direct %} This is the one-split variant: it
// normalises and writes the output itself.{% else %} Each split that holds keys writes its
// normalised partial O and its log-sum-exp (base 2; −inf where no key was visible) to the
// scratch `part`: O as [rows][splits][{{ heads }}][512] f32, then lse as [rows][splits][{{ heads }}];
// the merge kernel combines them. Splits past the row's last tile (half of them at a 1k
// context and batch 1) return at once: loading the queries and writing an lse for the merge
// to skip cost them a block's latency, and the merge read their stale 128 KiB of O from DRAM
// (8 MiB of a 7 µs merge at one key, Nsight Compute on an H200,
// tests/gpu/results/2026-12-01r/call0).{% endif %}
extern "C" __global__ void __launch_bounds__(256, 1) {{ name }}(
{%- if direct %}
    bf16* __restrict__ out, i64 out_row, i64 out_head,
{%- else %}
    float* __restrict__ part,
{%- endif %}
    const bf16* __restrict__ q1, i64 q1_row, i64 q1_head,
    const bf16* __restrict__ q2, i64 q2_row, i64 q2_head,
    const bf16* __restrict__ k1, i64 k1_seq, i64 k1_key,
    const bf16* __restrict__ k2, i64 k2_seq, i64 k2_key,
    const i64* __restrict__ positions,
{%- if sparse %}
    const i64* __restrict__ topk, i64 topk_row,
{%- endif %}
    i64 rows, i64 splits, float scale_log2{%- if slotted %},
    const i64* __restrict__ cache_slot, i64 k1_slot, i64 k2_slot{%- endif %})
{
    grid_dependency_control();
{%- if slotted %}
    // A prefill's caches are those of slot cache_slot[0]: each cache starts that many slots in
    // (0 apart for one held in the arena).
    k1 += cache_slot[0] * k1_slot;
    k2 += cache_slot[0] * k2_slot;
{%- endif %}
    constexpr int D1 = 512, D = D1 + 64, LDK = D + 8, VECS = D / 8;
    constexpr int HEADS = {{ heads }}, HG = {{ hg }}, GROUPS = HEADS / HG;
    constexpr int BN = 32, LDP = BN + 8, THREADS = 256;
    // [16][LDK] queries, [2][BN][LDK] keys, [2][16][BN] score halves, [16][LDP] probabilities,
    // per row: correction, sum and max, per key of a stage: whether it is visible. The 8-element
    // pad of a row (1168 and 80 bytes) puts the eight rows an ldmatrix phase reads on distinct
    // banks.
    bf16* const qs = reinterpret_cast<bf16*>(dynamic_smem);
    bf16* const ks = qs + 16 * LDK;
    float* const sp = reinterpret_cast<float*>(ks + 2 * BN * LDK);
    bf16* const ps = reinterpret_cast<bf16*>(sp + 2 * 16 * BN);
    float* const corr = reinterpret_cast<float*>(ps + 16 * LDP);
    float* const lsum = corr + 16;
    float* const lmax = lsum + 16;
    unsigned char* const visible = reinterpret_cast<unsigned char*>(lmax + 16);

    const i64 blk = blockIdx.x;
    const int group = (int)(blk % GROUPS);
    const i64 split = (blk / GROUPS) % splits;
    const i64 row = blk / GROUPS / splits;
    if (row >= rows) return;
{% include "mla_split.cuh" %}
    static_assert(BN == 32, "mla_split.cuh tiles the keys by 32");
    // A split past the row's keys has nothing to write: the merge reads only the first `used`.
    if (split >= used) return;
    const i64 t0 = split * per, t1 = min(tiles, t0 + per);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
{%- if sparse %}
    const bool listed = pos + 1 > {{ dense_until }};  // as mla_split.cuh counts the keys
    const i64* const list = topk + row * topk_row;
{%- endif %}

    // Head r of the group in row r of qs; rows past HG (8 heads) are zeros.
    for (int v = tid; v < 16 * VECS; v += THREADS) {
        const int r = v / VECS, c = v % VECS;
        const bool ok = r < HG;
        const i64 h = group * HG + (ok ? r : 0);
        const bf16* src = c < D1 / 8 ? q1 + row * q1_row + h * q1_head + c * 8
                                     : q2 + row * q2_row + h * q2_head + (c - D1 / 8) * 8;
        cp_async16(qs + r * LDK + c * 8, src, ok);
    }
    // Each key of a tile is copied by 8 threads, 9 vectors each (64 latent, 8 rope); a key that
    // is not visible reads nothing, lands as zeros and is masked out of the softmax.
    const int lkey = tid >> 3, lsub = tid & 7;
    const bf16* const k1r = k1 + row * k1_seq;
    const bf16* const k2r = k2 + row * k2_seq;
    // The cache row of this thread's key in `tile` (−1: none). Its value is used a tile later
    // than it is read, so the read of a top-k entry is off the copy's critical path.
    auto key_of = [&](i64 tile) -> i64 {
        const i64 slot = tile * BN + lkey;
        if (slot >= keys) return -1;
{%- if sparse %}
        if (listed) return list[slot];
{%- endif %}
        return slot;
    };
    auto load = [&](int stage, i64 j) {
        const bool ok = j >= 0 && j <= pos;
        if (lsub == 0) visible[stage * BN + lkey] = ok;
        bf16* const dst = ks + (stage * BN + lkey) * LDK;
        const bf16* const a = k1r + (ok ? j : 0) * k1_key;
        const bf16* const b = k2r + (ok ? j : 0) * k2_key;
#pragma unroll
        for (int i = 0; i < VECS / 8; ++i) {
            const int c = lsub + i * 8;
            cp_async16(dst + c * 8, i < D1 / 64 ? a + c * 8 : b + lsub * 8, ok);
        }
    };

    float o[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][e] = 0.f;
    // The softmax state of head row `srow`, the same in its 16 threads.
    const int srow = tid >> 4, scol = (tid & 15) * 2;
    float m = -INFINITY, l = 0.f;

    // Both stages are filled before the first tile is computed, and a stage is refilled (tile
    // t + 2) as soon as tile t is done with it, so while a block waits two tiles are on their
    // way: cp.async group i holds tile t0 + i (the first also the queries).
    {
        const i64 j0 = key_of(t0), j1 = key_of(t0 + 1);
        if (t0 < t1) load(0, j0);
        cp_async_commit();
        if (t0 + 1 < t1) load(1, j1);
        cp_async_commit();
    }
    i64 jn = key_of(t0 + 2);
    for (i64 t = t0; t < t1; ++t) {
        const int s = (int)((t - t0) & 1);
        cp_async_wait<1>();
        // Tile t has landed for every thread (only the group of t + 1 may be outstanding).
        __syncthreads();
        const bf16* const kt = ks + s * BN * LDK;
        {
            const int nt = warp & 3, kh = warp >> 2;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int kk = 0; kk < D / 2; kk += 32) {
                const int k0 = kh * (D / 2) + kk;
                unsigned a0[4], a1[4], b[4];
                ldmatrix_x4(a0, qs + (lane & 15) * LDK + k0 + (lane >> 4) * 8);
                ldmatrix_x4(a1, qs + (lane & 15) * LDK + k0 + 16 + (lane >> 4) * 8);
                // b0, b1 of the k step at k0 (lanes 0-15), then of k0 + 16 (lanes 16-31).
                ldmatrix_x4(b, kt + (nt * 8 + (lane & 7)) * LDK + k0 + (lane >> 3) * 8);
                mma_bf16(acc, a0, b[0], b[1]);
                mma_bf16(acc, a1, b[2], b[3]);
            }
            float* const half = sp + kh * 16 * BN;
            *reinterpret_cast<float2*>(half + g * BN + nt * 8 + t4 * 2) = make_float2(acc[0], acc[1]);
            *reinterpret_cast<float2*>(half + (g + 8) * BN + nt * 8 + t4 * 2) = make_float2(acc[2], acc[3]);
        }
        __syncthreads();
        {
            const float2 lo = *reinterpret_cast<const float2*>(sp + srow * BN + scol);
            const float2 hi = *reinterpret_cast<const float2*>(sp + 16 * BN + srow * BN + scol);
            const float x0 = visible[s * BN + scol] ? (lo.x + hi.x) * scale_log2 : -INFINITY;
            const float x1 = visible[s * BN + scol + 1] ? (lo.y + hi.y) * scale_log2 : -INFINITY;
            float mx = fmaxf(x0, x1);
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(m, mx);
            // Until a row has seen a visible key its max is −inf: subtract 0 instead, so every
            // probability and the correction are exactly 0, never NaN.
            const float base = m_new == -INFINITY ? 0.f : m_new;
            const float c = exp2f(m - base);
            const float p0 = exp2f(x0 - base), p1 = exp2f(x1 - base);
            float sum = p0 + p1;
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            l = l * c + sum;
            m = m_new;
            *reinterpret_cast<__nv_bfloat162*>(ps + srow * LDP + scol) = __floats2bfloat162_rn(p0, p1);
            if ((tid & 15) == 0) corr[srow] = c;
        }
        __syncthreads();
        {
            const float c0 = corr[g], c1 = corr[g + 8];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                o[nt][0] *= c0;
                o[nt][1] *= c0;
                o[nt][2] *= c1;
                o[nt][3] *= c1;
            }
#pragma unroll
            for (int kk = 0; kk < BN; kk += 16) {
                unsigned a[4];
                ldmatrix_x4(a, ps + (lane & 15) * LDP + kk + (lane >> 4) * 8);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    // b0, b1 of columns warp·64 + j·16 (lanes 0-15), then of the next 8.
                    unsigned b[4];
                    ldmatrix_x4_trans(b, kt + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * LDK + warp * 64
                                             + j * 16 + (lane >> 4) * 8);
                    mma_bf16(o[2 * j], a, b[0], b[1]);
                    mma_bf16(o[2 * j + 1], a, b[2], b[3]);
                }
            }
        }
        // Every warp is done with stage s and with this tile's scores and probabilities.
        __syncthreads();
        if (t + 2 < t1) load(s, jn);
        cp_async_commit();
        jn = key_of(t + 3);
    }
    cp_async_wait<0>();
    if ((tid & 15) == 0) {
        lsum[srow] = l;
        lmax[srow] = m;
    }
    __syncthreads();

    // Accumulator e of an m16n8 tile is head row g + (e / 2)·8, column t4·2 + e % 2.{% if not direct %}
    // A head that saw no key writes no partial O: its lse is −inf and the merge gives it weight 0
    // without using the O it reads (a split whose keys are all hidden: −1 entries, or past the
    // position).{% endif %}
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = g + half * 8;
        if (r < HG{% if not direct %} && lsum[r] > 0.f{% endif %}) {
            const float inv = lsum[r] > 0.f ? 1.f / lsum[r] : 0.f;
            const i64 h = group * HG + r;
{%- if direct %}
            bf16* const dst = out + row * out_row + h * out_head + warp * 64 + t4 * 2;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
                *reinterpret_cast<__nv_bfloat162*>(dst + nt * 8) =
                    __floats2bfloat162_rn(o[nt][half * 2] * inv, o[nt][half * 2 + 1] * inv);
{%- else %}
            float* const dst = part + ((row * splits + split) * HEADS + h) * D1 + warp * 64 + t4 * 2;
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
                *reinterpret_cast<float2*>(dst + nt * 8) =
                    make_float2(o[nt][half * 2] * inv, o[nt][half * 2 + 1] * inv);
{%- endif %}
        }
    }
{%- if not direct %}
    if (tid < HG) {
        float* const lse = part + rows * splits * HEADS * D1 + (row * splits + split) * HEADS;
        lse[group * HG + tid] = lsum[tid] > 0.f ? lmax[tid] + log2f(lsum[tid]) : -INFINITY;
    }
{%- endif %}
}
