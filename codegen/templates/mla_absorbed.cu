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
// a cycle against ~400 of MMAs, and four blocks read each key: heads in multiples of 32 take
// mla_absorbed_wide.cu instead, whose queries sit in registers at one block an SM.
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
{% include "mla_head.cuh" %}
    constexpr int D1 = 512, D = D1 + 64, LDK = D + 8, VECS = D / 8;
    constexpr int HEADS = {{ heads }}, HG = {{ hg }}, GROUPS = HEADS / HG;
    constexpr int BN = 32, LDP = BN + 8, THREADS = 256, MI = 1, ROW_LANES = 16;
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

{% include "mla_keys.cuh" %}

    // Head r of the group in row r of qs; rows past HG (8 heads) are zeros.
    for (int v = tid; v < 16 * VECS; v += THREADS) {
        const int r = v / VECS, c = v % VECS;
        const bool ok = r < HG;
        const i64 h = group * HG + (ok ? r : 0);
        const bf16* src = c < D1 / 8 ? q1 + row * q1_row + h * q1_head + c * 8
                                     : q2 + row * q2_row + h * q2_head + (c - D1 / 8) * 8;
        cp_async16(qs + r * LDK + c * 8, src, ok);
    }
    float o[MI][8][4];
    zero_tiles(o);
    // The softmax state of head row `srow`, the same in its 16 threads.
    const int srow = tid >> 4, scol = (tid & 15) * 2;
    float m = -INFINITY, l = 0.f;

    // Both stages are filled before the first tile is computed, and a stage is refilled (tile
    // t + 2) as soon as tile t is done with it, so while a block waits two tiles are on their
    // way: cp.async group i holds tile t0 + i (the first also the queries).
    ring_start();
    for (i64 t = t0; t < t1; ++t) {
        const int s = (int)((t - t0) & 1);
        ring_wait(s, t);
        // Tile t has landed for the block.
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
            float x[2] = {visible[s * BN + scol] ? (lo.x + hi.x) * scale_log2 : -INFINITY,
                          visible[s * BN + scol + 1] ? (lo.y + hi.y) * scale_log2 : -INFINITY};
            const float c = online_softmax<16>(x, m, l);
            *reinterpret_cast<__nv_bfloat162*>(ps + srow * LDP + scol) = __floats2bfloat162_rn(x[0], x[1]);
            if ((tid & 15) == 0) corr[srow] = c;
        }
        __syncthreads();
        {
            const float c0 = corr[g], c1 = corr[g + 8];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                o[0][nt][0] *= c0;
                o[0][nt][1] *= c0;
                o[0][nt][2] *= c1;
                o[0][nt][3] *= c1;
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
                    mma_bf16(o[0][2 * j], a, b[0], b[1]);
                    mma_bf16(o[0][2 * j + 1], a, b[2], b[3]);
                }
            }
        }
        // Every warp is done with stage s and with this tile's scores and probabilities.
        __syncthreads();
        ring_next(s, t);
    }
{% include "mla_out.cuh" %}
}
