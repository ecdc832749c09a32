// {{ op }} on the tensor cores for few heads: absorbed MLA over the latent cache, {{ heads }}
// heads of 512 latent + 64 rope dims, at most 8 a block, bf16 in, f32 accumulation (mma.sync
// m16n8k16). The math, the splits (in 32-key tiles, as mla_split.cuh counts them) and the output
// are mla_absorbed.cu's; what differs is the shape of the products and the depth of the ring.
//
// Why: at 8 heads (GLM-5 at TP=8) mla_absorbed.cu's m16 tile of heads is half empty and the
// kernel is bound by how many key bytes are on their way, which its two 32-key stages beside an
// 18 KiB Q tile cap at 36–73 KiB a block. Here the keys are the MMA's rows and the heads its 8
// columns: S = Q·Kᵀ is computed as Sᵀ = K·Qᵀ with Qᵀ's fragments in registers (10 a thread) and
// O = P·V as Oᵀ = Vᵀ·Pᵀ, with Pᵀ's fragments made in registers by the softmax itself, so the
// shared memory holds little but the ring: five stages of 16 keys (91 KiB), four of them on
// their way while one is computed. A stage is refilled at the top of the tile after the one it
// held, right after the barrier that says every warp is done with it, so a tile costs two
// barriers, not four.
//
// A lowering variant (Variant::Mla(MlaKernel::FewHeads)) that the attention test times beside the
// shipped kernel at every 8-head case; it has not yet run on a GPU (tests/gpu/README.md, the
// nineteenth session), so nothing ships it.
//
// 8 warps, 16 threads a key in the ring. Sᵀ: warp w takes the k steps w, w + 8, … of the 36 (16
// dims each) for all 16 keys, and the eight partial sums meet in shared memory. Softmax: every
// warp computes it for all 8 heads from the partials (thread (g, t4): head g, keys 2·t4, 2·t4 +
// 1, 2·t4 + 8, 2·t4 + 9, exactly the Pᵀ fragment it feeds the MMA), online in f32 in base 2, P
// rounded to bf16 for the MMA while the sums use the f32 values. Oᵀ: warp w owns latent rows
// w·64.. (four m16n8 accumulators of 8 heads).
{% include "mla_head.cuh" %}
    constexpr int D1 = 512, D = D1 + 64, LDK = D + 8;
    constexpr int HEADS = {{ heads }}, HG = {{ hg }}, GROUPS = HEADS / HG;
    constexpr int BN = 16, STAGES = 5, KSTEPS = D / 16, WARPS = 8, THREADS = 256, LDS = BN + 8;
    static_assert(HG <= 8 && HEADS % HG == 0, "at most 8 heads a block, the MMA's 8 columns");
    // [STAGES][BN][LDK] keys, [WARPS][8][LDS] Sᵀ partials (head-major), per key of a stage: whether
    // it is visible. The 8-element pad of a key row puts the eight rows an ldmatrix phase reads
    // on distinct banks; that of a partial row the 16 lanes of a half warp's float2 reads.
    bf16* const ks = reinterpret_cast<bf16*>(dynamic_smem);
    float* const sp = reinterpret_cast<float*>(ks + STAGES * BN * LDK);
    unsigned char* const visible = reinterpret_cast<unsigned char*>(sp + WARPS * 8 * LDS);

{% include "mla_ring.cuh" %}
    // The ring's first tiles are on their way before the queries are read.
    ring_start();

    // Qᵀ's B fragments of head g over k steps warp + 8i: b0 the dims 2·t4.., b1 those 8 further.
    constexpr int QSTEPS = (KSTEPS + WARPS - 1) / WARPS;
    unsigned qb[QSTEPS][2];
    {
        const bool ok = g < HG;
        const i64 h = group * HG + (ok ? g : 0);
#pragma unroll
        for (int i = 0; i < QSTEPS; ++i) {
            const int k = (warp + WARPS * i) * 16;
            const bool in_d = k < D;
            // Past the last k step (warps 4-7's fifth) the address stays in the row, unread.
            const int k0 = in_d ? k : 0;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int c = k0 + half * 8 + t4 * 2;
                const bf16* src = c < D1 ? q1 + row * q1_row + h * q1_head + c
                                         : q2 + row * q2_row + h * q2_head + (c - D1);
                qb[i][half] = ok && in_d ? *reinterpret_cast<const unsigned*>(src) : 0u;
            }
        }
    }
    float o[4][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mi][e] = 0.f;
    // The softmax state of head g, the same in its four t4 lanes.
    float m = -INFINITY, l = 0.f;

    for (i64 u = u0; u < u1; ++u) {
        const int s = (int)((u - u0) % STAGES);
        cp_async_wait<STAGES - 2>();
        // Tile u has landed for every thread, and every warp is done with tile u − 1: its stage
        // takes tile u + STAGES − 1 and the partials can be overwritten.
        __syncthreads();
        ring_refill(s, u);
        const bf16* const kt = ks + s * BN * LDK;
        {
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int i = 0; i < QSTEPS; ++i) {
                const int k0 = (warp + WARPS * i) * 16;
                if (k0 < D) {
                    unsigned a[4];
                    ldmatrix_x4(a, kt + (lane & 15) * LDK + k0 + (lane >> 4) * 8);
                    mma_bf16(acc, a, qb[i][0], qb[i][1]);
                }
            }
            // acc: keys g and g + 8, heads 2·t4 and 2·t4 + 1.
            float* const part_w = sp + warp * 8 * LDS;
            part_w[(2 * t4) * LDS + g] = acc[0];
            part_w[(2 * t4 + 1) * LDS + g] = acc[1];
            part_w[(2 * t4) * LDS + g + 8] = acc[2];
            part_w[(2 * t4 + 1) * LDS + g + 8] = acc[3];
        }
        __syncthreads();
        unsigned pb[2];
        float c;
        {
            float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                const float* const r = sp + (w * 8 + g) * LDS + 2 * t4;
                const float2 lo = *reinterpret_cast<const float2*>(r);
                const float2 hi = *reinterpret_cast<const float2*>(r + 8);
                x[0] += lo.x;
                x[1] += lo.y;
                x[2] += hi.x;
                x[3] += hi.y;
            }
            const unsigned char* const vis = visible + s * BN + 2 * t4;
#pragma unroll
            for (int e = 0; e < 4; ++e) x[e] = vis[(e >> 1) * 8 + (e & 1)] ? x[e] * scale_log2 : -INFINITY;
            c = online_softmax<4>(x, m, l);
            const __nv_bfloat162 p0 = __floats2bfloat162_rn(x[0], x[1]), p1 = __floats2bfloat162_rn(x[2], x[3]);
            pb[0] = *reinterpret_cast<const unsigned*>(&p0);
            pb[1] = *reinterpret_cast<const unsigned*>(&p1);
        }
        {
            // The corrections of this thread's accumulator columns, heads 2·t4 and 2·t4 + 1.
            const float c0 = __shfl_sync(0xffffffffu, c, 8 * t4), c1 = __shfl_sync(0xffffffffu, c, 8 * t4 + 4);
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                o[mi][0] *= c0;
                o[mi][1] *= c1;
                o[mi][2] *= c0;
                o[mi][3] *= c1;
                // Vᵀ's A fragment of latent rows warp·64 + mi·16.. over the tile's 16 keys.
                unsigned a[4];
                ldmatrix_x4_trans(a, kt + ((lane & 7) + (lane >> 4) * 8) * LDK + warp * 64 + mi * 16
                                         + ((lane >> 3) & 1) * 8);
                mma_bf16(o[mi], a, pb[0], pb[1]);
            }
        }
    }
    cp_async_wait<0>();

    // o[mi]: latent rows warp·64 + mi·16 + g (+ 8), heads 2·t4 and 2·t4 + 1; head h's sum and max
    // are held by lanes 4h to 4h + 3.
    const float l0 = __shfl_sync(0xffffffffu, l, 8 * t4), l1 = __shfl_sync(0xffffffffu, l, 8 * t4 + 4);
    const float inv[2] = {l0 > 0.f ? 1.f / l0 : 0.f, l1 > 0.f ? 1.f / l1 : 0.f};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int r = 2 * t4 + e;
{%- if not direct %}
        // A head that saw no key writes no partial O: its lse is −inf and the merge gives it
        // weight 0 without using the O it reads.
        if (r >= HG || inv[e] == 0.f) continue;
{%- else %}
        if (r >= HG) continue;
{%- endif %}
        const i64 h = group * HG + r;
#pragma unroll
        for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int d = warp * 64 + mi * 16 + g + half * 8;
                const float v = o[mi][half * 2 + e] * inv[e];
{%- if direct %}
                out[row * out_row + h * out_head + d] = __float2bfloat16_rn(v);
{%- else %}
                part[((row * splits + split) * HEADS + h) * D1 + d] = v;
{%- endif %}
            }
        }
    }
{%- if not direct %}
    if (t4 == 0 && g < HG && warp == 0) {
        float* const lse = part + rows * splits * HEADS * D1 + (row * splits + split) * HEADS;
        lse[group * HG + g] = l > 0.f ? m + log2f(l) : -INFINITY;
    }
{%- endif %}
}
