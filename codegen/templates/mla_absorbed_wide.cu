// {{ op }} on the tensor cores for many heads: absorbed MLA over the latent cache, {{ heads }}
// heads of 512 latent + 64 rope dims in groups of 32 a block, bf16 in, f32 accumulation
// (mma.sync m16n8k16). The math, the splits, the key ring and the output are mla_absorbed.cu's
// (which takes up to 16 heads a block); what differs is where the queries live.
//
// Why 32 heads and queries in registers: at 16 heads a block (mla_absorbed.cu) a 64-head row
// costs four blocks, each reading every key from shared memory three times over (its Q tile too,
// once per key-quarter warp), and an H200 ran GLM-5's 64 heads at batch 64 × 32k context at 19%
// of the roofline, bound by shared-memory reads. Here each warp keeps the A fragments of 16 heads
// × 144 dims (36 registers) for the whole block, so S = Q·Kᵀ reads only keys, each twice (once
// per 16-head half), and every value fragment of O += P·V serves both halves: a 32-key tile of 32
// heads reads 74 KiB of keys, 32 of values, 16 of probabilities and 32 of score partials, so a
// 64-head row reads 308 KiB a tile in two blocks, against 606 KiB in four 16-head blocks. The
// shared memory is then two 32-key stages (73 KiB), the score partials and the probabilities:
// 96 KiB, under SM120's 99 KiB.
//
// 8 warps, one block an SM (194 registers a thread). S: warp w computes heads (w % 2)·16.. over
// dims (w / 2)·144.. for all 32 keys of the tile (four independent accumulator chains, the next
// k step's key fragments read before this step's MMAs), and the four dim quarters are summed in
// shared memory. Softmax: 8 threads per head row, 4 keys each. O: warp w owns latent columns
// w·64.. of all 32 heads (2 × 8 m16n8 accumulators), rescaled by each row's correction every
// tile. Measured on an H100 (tests/gpu/results/2026-12-06b): 16 warps at 126 registers (O tiles
// of 32 columns a warp, keys split between warp halves in S) were slower, 182.0 against 174.7 µs
// at batch 64 × 32k and 5.9 against 5.5 ms for a 4096-token sparse prefill; so was asking L2
// for the tiles after the ring's two (no faster here, 12% slower at 8 heads). Nsight Compute
// (calls A and B) finds the block latency-bound: an instruction issued every 5 cycles a
// scheduler, the warps waiting on the ring (long scoreboard, 2.0 cycles an instruction),
// fixed-latency MMA and ldmatrix chains (1.8, 1.0) and the four barriers a tile (0.9).
{% include "mla_head.cuh" %}
    constexpr int D1 = 512, D = D1 + 64, LDK = D + 8;
    constexpr int HEADS = {{ heads }}, HG = 32, GROUPS = HEADS / HG, MI = 2, ROW_LANES = 8;
    constexpr int BN = 32, LDP = BN + 8, LDS = BN + 8, QUARTER = D / 4, KSTEPS = QUARTER / 16, THREADS = 256;
    // P·V reads all four of a k step's value blocks before its 32 MMAs (mla_pv.cuh).
    constexpr int V_AHEAD = 4;
    static_assert(HEADS % HG == 0 && QUARTER % 16 == 0, "32-head groups, k steps within a quarter");
    // [2][BN][LDK] keys, [4][HG][LDS] score partials (one per dim quarter), [HG][LDP]
    // probabilities, per row: correction, sum and max, per key of a stage: whether it is visible.
    // Rows padded by 8 elements put the rows an ldmatrix phase (or a half warp's float2 stores)
    // touches on distinct banks.
    bf16* const ks = reinterpret_cast<bf16*>(dynamic_smem);
    float* const sp = reinterpret_cast<float*>(ks + 2 * BN * LDK);
    bf16* const ps = reinterpret_cast<bf16*>(sp + 4 * HG * LDS);
    float* const corr = reinterpret_cast<float*>(ps + HG * LDP);
    float* const lsum = corr + HG;
    float* const lmax = lsum + HG;
    unsigned char* const visible = reinterpret_cast<unsigned char*>(lmax + HG);

{% include "mla_keys.cuh" %}
    const int ms = warp & 1, kq = warp >> 1;

    // The ring's first two tiles are on their way before the queries are read.
    ring_start();

    // The warp's heads and dims in the score MMAs.
    const int qhead = ms * 16, qdim = kq * QUARTER;
{% include "mla_scores.cuh" %}

    float o[MI][8][4];
    zero_tiles(o);
    // The softmax state of head row `srow`, the same in its 8 threads.
    const int srow = tid >> 3, scol = (tid & 7) * 4;
    float m = -INFINITY, l = 0.f;

    for (i64 t = t0; t < t1; ++t) {
        const int s = (int)((t - t0) & 1);
        ring_wait(s, t);
        __syncthreads();
        const bf16* const kt = ks + s * BN * LDK;
        {
            float acc[4][4];
            scores(kt, acc);
            float* const q = sp + (kq * HG + ms * 16 + g) * LDS + t4 * 2;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                *reinterpret_cast<float2*>(q + nt * 8) = make_float2(acc[nt][0], acc[nt][1]);
                *reinterpret_cast<float2*>(q + 8 * LDS + nt * 8) = make_float2(acc[nt][2], acc[nt][3]);
            }
        }
        __syncthreads();
        {
            float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float4 v = *reinterpret_cast<const float4*>(sp + (q * HG + srow) * LDS + scol);
                x[0] += v.x;
                x[1] += v.y;
                x[2] += v.z;
                x[3] += v.w;
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) x[i] = visible[s * BN + scol + i] ? x[i] * scale_log2 : -INFINITY;
            const float c = online_softmax<ROW_LANES>(x, m, l);
            const __nv_bfloat162 p01 = __floats2bfloat162_rn(x[0], x[1]), p23 = __floats2bfloat162_rn(x[2], x[3]);
            *reinterpret_cast<uint2*>(ps + srow * LDP + scol) =
                make_uint2(*reinterpret_cast<const unsigned*>(&p01), *reinterpret_cast<const unsigned*>(&p23));
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
