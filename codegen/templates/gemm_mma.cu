// matmul (tensor cores): y[M, {{ n }}] = x[M, {{ k }}] · w[{{ n }}, {{ k }}]ᵀ, bf16 operands, f32
// accumulation with mma.sync.m16n8k16 (the instruction SM120 has; no wgmma, no tcgen05).
// Block tile 128×128×32 on 8 warps arranged 4 (rows) × 2 (columns), each warp 32×64: per 16-wide
// k step, 2×8 mma from fragments read out of shared memory with 32-bit loads. Two shared stages
// of 128×(32+8) bf16 for x and for w, 40 KiB: the next k tile is loaded into registers while the
// current one is multiplied, then stored to the other stage. The 8-element row pad puts the rows
// a fragment load touches on distinct banks. Rows past M and columns past N are zero-filled on
// the way in and skipped on the way out; K is a multiple of 8 (16-byte loads).
extern "C" __global__ void __launch_bounds__(256, 1) {{ name }}(
    {{ y_t }}* __restrict__ y, i64 y_row,
    const bf16* __restrict__ x, i64 x_row,
    const bf16* __restrict__ w,
    i64 rows)
{
    constexpr int BM = 128, BN = 128, BK = 32, LDS = BK + 8;
    constexpr i64 N = {{ n }}, K = {{ k }}, N_TILES = (N + BN - 1) / BN;
    __shared__ __align__(16) bf16 sx[2][BM * LDS];
    __shared__ __align__(16) bf16 sw[2][BN * LDS];
    const i64 m0 = (i64)(blockIdx.x / N_TILES) * BM, n0 = (i64)(blockIdx.x % N_TILES) * BN;
    if (m0 >= rows) return;  // the grid is rounded up to whole row tiles
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp >> 1, wn = warp & 1, g = lane >> 2, t4 = lane & 3;

    // Each thread moves two 16-byte vectors of each tile: row tid/4 (+64), columns (tid%4)*8.
    uint4 rx[2], rw[2];
    auto fetch = [&](i64 k0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = (tid >> 2) + i * 64, c = (tid & 3) * 8;
            const bool in_k = k0 + c < K;
            rx[i] = (m0 + r < rows && in_k)
                ? *reinterpret_cast<const uint4*>(x + (m0 + r) * x_row + k0 + c) : make_uint4(0, 0, 0, 0);
            rw[i] = (n0 + r < N && in_k)
                ? *reinterpret_cast<const uint4*>(w + (n0 + r) * K + k0 + c) : make_uint4(0, 0, 0, 0);
        }
    };
    auto stash = [&](int stage) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = (tid >> 2) + i * 64, c = (tid & 3) * 8;
            *reinterpret_cast<uint4*>(&sx[stage][r * LDS + c]) = rx[i];
            *reinterpret_cast<uint4*>(&sw[stage][r * LDS + c]) = rw[i];
        }
    };

    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

    fetch(0);
    stash(0);
    __syncthreads();
    constexpr i64 STEPS = (K + BK - 1) / BK;
    for (i64 s = 0; s < STEPS; ++s) {
        const int stage = s & 1;
        if (s + 1 < STEPS) fetch((s + 1) * BK);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned a[2][4], b[8][2];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const bf16* p = &sx[stage][(wm * 32 + mi * 16 + g) * LDS + kk + t4 * 2];
                a[mi][0] = *reinterpret_cast<const unsigned*>(p);
                a[mi][1] = *reinterpret_cast<const unsigned*>(p + 8 * LDS);
                a[mi][2] = *reinterpret_cast<const unsigned*>(p + 8);
                a[mi][3] = *reinterpret_cast<const unsigned*>(p + 8 * LDS + 8);
            }
#pragma unroll
            for (int ni = 0; ni < 8; ++ni) {
                const bf16* p = &sw[stage][(wn * 64 + ni * 8 + g) * LDS + kk + t4 * 2];
                b[ni][0] = *reinterpret_cast<const unsigned*>(p);
                b[ni][1] = *reinterpret_cast<const unsigned*>(p + 8);
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 8; ++ni)
                    asm volatile(
                        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                        {% raw %}"{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"{% endraw %}
                        : "+f"(acc[mi][ni][0]), "+f"(acc[mi][ni][1]), "+f"(acc[mi][ni][2]), "+f"(acc[mi][ni][3])
                        : "r"(a[mi][0]), "r"(a[mi][1]), "r"(a[mi][2]), "r"(a[mi][3]),
                          "r"(b[ni][0]), "r"(b[ni][1]));
        }
        if (s + 1 < STEPS) {
            stash(stage ^ 1);
            __syncthreads();
        }
    }

#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 r = m0 + wm * 32 + mi * 16 + g + (e >> 1) * 8;
                const i64 c = n0 + wn * 64 + ni * 8 + t4 * 2 + (e & 1);
                if (r < rows && c < N) st(y + r * y_row + c, acc[mi][ni][e]);
            }
}
