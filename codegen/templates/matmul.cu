// {{ op }}: y[r, h, :] = x[r, h, :] · w[h]ᵀ with K = {{ k }}, {{ n }} columns, {{ heads }} head(s).
// Baseline SIMT GEMM: one block of 256 threads per 64 × 64 output tile of one head, K in steps of
// 16 through shared memory (2 × 16 × 68 f32 = 8.5 KiB: far under SM120's 99 KiB, no wgmma), each
// thread a 4 × 4 register tile accumulated in f32; every edge is predicated, so any row count and
// any K or N works. Blocks past the last row tile (the grid is rounded up) exit at once.
{%- if rope %}
// Rope epilogue: in every block of {{ period }} columns, columns {{ start }}..{{ end }} are
// rotated at the row's position ({% if interleaved %}pairs (2i, 2i+1){% else %}pairs (i, i+{{ half }}){% endif %}, theta {{ theta }}).
// The tile walks a permuted column order in which each block's rotated pairs come first, two
// adjacent columns per pair, and blocks are padded to an even width, so a thread holds both
// members of every pair it rotates; the angle is reduced in f64 as the rope kernel does.
__device__ const double {{ name }}_inv_freq[{{ half }}] = { {{ inv_freq }} };
{%- endif %}

extern "C" __global__ void __launch_bounds__(256, 1) {{ name }}(
    {{ y_t }}* __restrict__ y, i64 y_row, i64 y_head,
    const {{ x_t }}* __restrict__ x, i64 x_outer, i64 x_row, i64 x_inner_rows, i64 x_head,
    const {{ w_t }}* __restrict__ w,
{%- if rope %}
    const i64* __restrict__ positions, i64 rows_per_position,
{%- endif %}
    i64 rows)
{
    constexpr int K = {{ k }}, N = {{ n }}, HEADS = {{ heads }};
    constexpr int BM = 64, BN = 64, BK = 16;
{%- if rope %}
    constexpr int PERIOD = {{ period }}, START = {{ start }}, R = {{ end }} - {{ start }}, HALF = R / 2;
    constexpr int PADDED = PERIOD + PERIOD % 2;
    constexpr int COLS = N / PERIOD * PADDED;
    // The column a permuted index stands for, or -1 for a block's padding column.
    auto column = [](int l) -> int {
        const int block = l / PADDED, o = l % PADDED;
        if (o >= PERIOD) return -1;
        int c;
        if (o < R) {
            {% if interleaved %}c = START + o;{% else %}c = START + o / 2 + (o % 2) * HALF;{% endif %}
        } else {
            c = o - R < START ? o - R : o;
        }
        return block * PERIOD + c;
    };
{%- else %}
    constexpr int COLS = N;
    auto column = [](int l) -> int { return l; };
{%- endif %}
    constexpr int N_TILES = (COLS + BN - 1) / BN;
    __shared__ float as[BK][BM + 4];
    __shared__ float bs[BK][BN + 4];

    i64 b = blockIdx.x;
    const int nt = (int)(b % N_TILES);
    b /= N_TILES;
    const int h = (int)(b % HEADS);
    const i64 m0 = b / HEADS * BM;
    if (m0 >= rows) return;

    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int lr = tid / 4, lk = (tid % 4) * 4;
    const i64 a_row = m0 + lr;
    const bool a_ok = a_row < rows;
    const {{ x_t }}* xa = x + (a_ok ? (a_row / x_inner_rows) * x_outer + (a_row % x_inner_rows) * x_row + h * x_head : 0);
    const int b_col = nt * BN + lr < COLS ? column(nt * BN + lr) : -1;
    const {{ w_t }}* wb = w + (i64)h * N * K + (b_col >= 0 ? (i64)b_col * K : 0);

    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int kk = k0 + lk + i;
            as[lk + i][lr] = a_ok && kk < K ? ld(xa + kk) : 0.f;
            bs[lk + i][lr] = b_col >= 0 && kk < K ? ld(wb + kk) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = as[kk][ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx * 4 + j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const i64 r = m0 + ty * 4 + i;
        if (r >= rows) continue;
{%- if rope %}
        const double two_pi = 6.283185307179586;
        const double pos = (double)positions[r / rows_per_position];
#pragma unroll
        for (int j = 0; j < 4; j += 2) {
            const int l = nt * BN + tx * 4 + j;
            if (l < COLS && l % PADDED < R) {
                double angle = pos * {{ name }}_inv_freq[(l % PADDED) / 2];
                angle -= two_pi * rint(angle / two_pi);
                float s, c;
                // |angle| ≤ π: the intrinsic is accurate there and needs no local memory.
                __sincosf((float)angle, &s, &c);
                const float x0 = acc[i][j], x1 = acc[i][j + 1];
                acc[i][j] = x0 * c - x1 * s;
                acc[i][j + 1] = x1 * c + x0 * s;
            }
        }
{%- endif %}
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int l = nt * BN + tx * 4 + j;
            const int c = l < COLS ? column(l) : -1;
            if (c >= 0) st(y + r * y_row + h * y_head + c, acc[i][j]);
        }
    }
}
