// {{ op }} on the tensor cores for many heads, 64 a block: absorbed MLA over the latent cache,
// {{ heads }} heads of 512 latent + 64 rope dims, bf16 in, f32 accumulation (mma.sync
// m16n8k16). The math, the splits, the key ring and the output are mla_absorbed.cu's; the
// queries live in registers as in mla_absorbed_wide.cu, which takes 32 heads a block.
//
// Why 64 heads: at 32 a block, GLM-5's row costs two blocks that each copy every key into
// shared memory and read it there, and a block's 32-key tile moved 194,560 bytes through
// shared memory for 904 cycles of MMAs, 1,520 cycles at 128 bytes a cycle (tests/gpu/README.md,
// "The twentieth session"): 3,040 cycles of shared memory for the row's tile. Here one block
// serves the row, and its 32-key tile moves 36 KiB of copies, 144 KiB of keys read for S (each
// by the four 16-head warps of its dim half), 16 + 16 KiB of score halves, 4 + 32 KiB of
// probabilities and 32 KiB of values: 280 KiB, 2,240 cycles, against 1,810 cycles of MMAs.
// Dim halves rather than quarters (which would read each key twice, not four times) because
// four [64][32] float partials do not fit beside the two key stages in SM120's 99 KiB. The
// price is registers: O takes 128 a thread and the queries 72, so the block runs one an SM,
// and a 64-row batch fills the GPU only in two splits and a merge.
//
// 8 warps. S: warp w computes heads (w % 4)·16.. over dims (w / 4)·288.. for all 32 keys of the
// tile (the key fragments of the next k step read before this step's MMAs), and the two dim
// halves are summed in shared memory, each half's [64][32] floats with its float4 columns
// swizzled by row so that the MMA's float2 stores and the softmax's float4 loads meet no bank
// twice. Softmax: 4 threads per head row, 8 keys each. O: warp w owns latent columns w·64.. of
// all 64 heads (4 × 8 m16n8 accumulators), rescaled by each row's correction every tile.
{% include "mla_head.cuh" %}
    constexpr int D1 = 512, D = D1 + 64, LDK = D + 8;
    constexpr int HEADS = {{ heads }}, HG = 64, GROUPS = HEADS / HG, MI = 4, ROW_LANES = 4;
    constexpr int BN = 32, LDP = BN + 8, HALF = D / 2, KSTEPS = HALF / 16, THREADS = 256;
    // P·V reads a k step's value blocks one at a time (mla_pv.cuh): with O for 64 heads and the
    // queries in registers there is no room for four.
    constexpr int V_AHEAD = 1;
    static_assert(HEADS % HG == 0 && (D1 - HALF) % 16 == 0, "64-head groups, no k step across the rope");
    // [2][BN][LDK] keys, [2][HG][BN] score halves, [HG][LDP] probabilities, per row:
    // correction, sum and max, per key of a stage: whether it is visible.
    bf16* const ks = reinterpret_cast<bf16*>(dynamic_smem);
    float* const sp = reinterpret_cast<float*>(ks + 2 * BN * LDK);
    bf16* const ps = reinterpret_cast<bf16*>(sp + 2 * HG * BN);
    float* const corr = reinterpret_cast<float*>(ps + HG * LDP);
    float* const lsum = corr + HG;
    float* const lmax = lsum + HG;
    unsigned char* const visible = reinterpret_cast<unsigned char*>(lmax + HG);

{% include "mla_keys.cuh" %}
    const int hq = warp & 3, kh = warp >> 2;
    // Row r of a score half keeps its float4 f at f ^ (2 · (r % 4) + r % 2): the four rows of
    // an MMA's half-warp float2 stores then cover the eight float4 bank groups once (the
    // swizzles differ above bit 0), and so do the two rows of a quarter warp's float4 loads,
    // even float4 against odd (they differ in bit 0).
    auto swizzle = [](int r) { return (((r & 3) << 1) | (r & 1)) << 2; };

    // The ring's first two tiles are on their way before the queries are read.
    ring_start();

    // The warp's heads and dims in the score MMAs.
    const int qhead = hq * 16, qdim = kh * HALF;
{% include "mla_scores.cuh" %}

    float o[MI][8][4];
    zero_tiles(o);
    // The softmax state of head row `srow`, the same in its 4 threads, which hold keys
    // scol..scol + 7 of a tile.
    const int srow = tid >> 2, scol = (tid & 3) * 8;
    float m = -INFINITY, l = 0.f;

    for (i64 t = t0; t < t1; ++t) {
        const int s = (int)((t - t0) & 1);
        ring_wait(s, t);
        __syncthreads();
        const bf16* const kt = ks + s * BN * LDK;
        {
            float acc[4][4];
            scores(kt, acc);
            // Rows hq·16 + g and + 8 share row % 4 = g % 4, so one swizzle serves both.
            float* const half = sp + (kh * HG + hq * 16 + g) * BN;
            const int sw = swizzle(g);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int col = (nt * 8 + t4 * 2) ^ sw;
                *reinterpret_cast<float2*>(half + col) = make_float2(acc[nt][0], acc[nt][1]);
                *reinterpret_cast<float2*>(half + 8 * BN + col) = make_float2(acc[nt][2], acc[nt][3]);
            }
        }
        __syncthreads();
        {
            const int sw = swizzle(srow);
            float x[8];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int col = (scol + u * 4) ^ sw;
                const float4 lo = *reinterpret_cast<const float4*>(sp + srow * BN + col);
                const float4 hi = *reinterpret_cast<const float4*>(sp + (HG + srow) * BN + col);
                x[u * 4] = lo.x + hi.x;
                x[u * 4 + 1] = lo.y + hi.y;
                x[u * 4 + 2] = lo.z + hi.z;
                x[u * 4 + 3] = lo.w + hi.w;
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) x[i] = visible[s * BN + scol + i] ? x[i] * scale_log2 : -INFINITY;
            const float c = online_softmax<ROW_LANES>(x, m, l);
            unsigned p[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const __nv_bfloat162 v = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
                p[i] = *reinterpret_cast<const unsigned*>(&v);
            }
            *reinterpret_cast<uint4*>(ps + srow * LDP + scol) = make_uint4(p[0], p[1], p[2], p[3]);
            if ((tid & (ROW_LANES - 1)) == 0) corr[srow] = c;
        }
        __syncthreads();
{% include "mla_pv.cuh" %}
        // Every warp is done with stage s and with this tile's scores and probabilities.
        __syncthreads();
        ring_next(s, t);
    }
{% include "mla_out.cuh" %}
}
