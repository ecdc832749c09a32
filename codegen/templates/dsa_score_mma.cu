// dsa.score on the tensor cores: I(n, j) = Σ_h w[n,h] · relu(q[n,h]·k[j]) over {{ heads }} heads of
// {{ dim }} dims, −inf for j > position, f32 throughout; w[n,h] is first scaled by w_scale and
// rounded to w's dtype, as `scale` stores it (the folded head-weight scale; 1 when none).
//
// A block of 8 warps takes {{ rows }} query row(s) and a chunk of {{ tiles }} × 128 keys: the
// row-heads of its rows ({{ rows }} × {{ heads }}) are the M side of one GEMM against the keys,
// each warp a tile of one row's {{ heads }} heads × {{ warp_keys }} keys (mma.sync m16n8k16, bf16
// operands, f32 accumulators). The epilogue stays in registers: relu, times w, summed over the
// thread's heads and then over the eight lanes (g) that hold the other heads of the same key, so
// a warp owns whole scores and nothing goes through shared memory. {{ rows }} > 1 only where all
// rows read one cache (prefill), so a K tile serves every row of the block; a decode's rows each
// have their own cache and take a block each (shapes `dsa_score_decode.cu` does not hold).
//
// Shared memory, dynamic: the block's queries ({{ rows }} × {{ heads }} × {{ dim }} bf16) and a
// two-stage cp.async ring of 128-key tiles, {{ smem_kib }} KiB (SM120 allows 99 KiB); rows of a
// multiple of 64 elements are XOR-swizzled by 16-byte chunk, others padded by one chunk, so
// ldmatrix reads no bank twice. Key tiles past the largest position of the block's rows are not
// read: their scores are −inf, written directly.
//
// Summation order (why bits differ from transformers, whose indexer computes q·kᵀ per head as
// one matmul, relu, multiplies by the weights and sums over heads with torch's reduction): here
// each dot product is summed by the tensor core in 16-element steps in f32, and the head sum
// goes over heads g, g + 8, g + 16, … in one thread, then pairs of lanes 4, 8 and 16 apart (a
// tree). Both are f32 sums of the same terms; scores differ by rounding (a few ulps), which can
// swap two keys whose scores tie within that in the top-k.
namespace {{ name }}_ {
constexpr int H = {{ heads }}, D = {{ dim }}, ROWS = {{ rows }}, TILES = {{ tiles }};
constexpr int BN = 128, THREADS = 256, WARPS = 8, WARPS_N = WARPS / ROWS, WN = BN / WARPS_N;
constexpr int MI = H / 16, NI = WN / 8, C = D / 8, CHUNK = TILES * BN;

template <int CH> __device__ __forceinline__ int at(int r, int c) {
    if constexpr (CH % 8 == 0) return (r * CH + (c ^ (r & 7))) * 8;
    else return (r * (CH + 1) + c) * 8;
}
__host__ __device__ constexpr int tile_elems(int rows) { return rows * (C % 8 == 0 ? C : C + 1) * 8; }
}  // namespace {{ name }}_

extern "C" __global__ void __launch_bounds__(256, 1) {{ name }}(
    float* __restrict__ out, i64 out_row,
    const bf16* __restrict__ q, i64 q_row, i64 q_head,
    const {{ w_t }}* __restrict__ w, i64 w_row, float w_scale,
    const bf16* __restrict__ k, i64 k_seq, i64 k_key,
    const i64* __restrict__ positions, i64 rows, i64 keys{%- if slotted %},
    const i64* __restrict__ cache_slot, i64 k_slot{%- endif %})
{
    grid_dependency_control();
{%- if slotted %}
    // A prefill's caches are those of slot cache_slot[0]: the cache starts that many slots in
    // (0 apart for one held in the arena).
    k += cache_slot[0] * k_slot;
{%- endif %}
    using namespace {{ name }}_;
    bf16* const sq = reinterpret_cast<bf16*>(dynamic_smem);
    bf16* const sk = sq + tile_elems(ROWS * H);
    __shared__ float ws[ROWS * H];
    __shared__ i64 pos_s[ROWS];

    const i64 chunks = (keys + CHUNK - 1) / CHUNK;
    if (chunks == 0) return;
    const i64 row0 = blockIdx.x / chunks * ROWS;
    if (row0 >= rows) return;
    const i64 j_begin = blockIdx.x % chunks * CHUNK;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const bf16* const kr = k + row0 * k_seq;

    for (int i = tid; i < ROWS; i += THREADS) pos_s[i] = row0 + i < rows ? positions[row0 + i] : -1;
    for (int i = tid; i < ROWS * H; i += THREADS) {
        const i64 row = row0 + i / H;
        ws[i] = row < rows ? rnd<{{ w_t }}>(ld(w + row * w_row + i % H) * w_scale) : 0.f;
    }
    for (int i = tid; i < ROWS * H * C; i += THREADS) {
        const int rh = i / C, c = i % C;
        const i64 row = row0 + rh / H;
        const bool ok = row < rows;
        cp_async16(sq + at<C>(rh, c), ok ? q + row * q_row + (rh % H) * q_head + c * 8 : q, ok);
    }
    __syncthreads();
    i64 last = -1;
    for (int i = 0; i < ROWS; ++i) last = max(last, pos_s[i]);
    const i64 j_end = min(j_begin + CHUNK, keys);
    // Tiles with a key some row sees; the rest of the chunk is −inf.
    const i64 seen_end = min(j_end, last + 1);
    const int tiles = seen_end > j_begin ? (int)((seen_end - j_begin + BN - 1) / BN) : 0;

    auto load = [&](int stage, i64 j0) {
        for (int i = tid; i < BN * C; i += THREADS) {
            const int r = i / C, c = i % C;
            const i64 j = j0 + r;
            const bool ok = j <= last;
            cp_async16(sk + stage * tile_elems(BN) + at<C>(r, c), ok ? kr + j * k_key + c * 8 : k, ok);
        }
    };

    const int wr = warp / WARPS_N, wn = warp % WARPS_N;
    const i64 row = row0 + wr;
    const i64 pos = pos_s[wr];
    float wh[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int e = 0; e < 2; ++e) wh[mi][e] = ws[wr * H + mi * 16 + g + e * 8];

    if (tiles > 0) load(0, j_begin);
    cp_async_commit();
    for (int kt = 0; kt < tiles; ++kt) {
        if (kt + 1 < tiles) load((kt + 1) & 1, j_begin + (i64)(kt + 1) * BN);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16* const tk = sk + (kt & 1) * tile_elems(BN);
        float acc[MI][NI][4];
        zero_tiles(acc);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned a[MI][4], b[NI / 2][4];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                ldmatrix_x4(a[mi], sq + at<C>(wr * H + mi * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
            for (int nj = 0; nj < NI / 2; ++nj)
                ldmatrix_x4(b[nj], tk + at<C>(wn * WN + nj * 16 + (lane >> 4) * 8 + (lane & 7), kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni)
                    mma_bf16(acc[mi][ni], a[mi], b[ni >> 1][(ni & 1) * 2], b[ni >> 1][(ni & 1) * 2 + 1]);
        }
        // Accumulator e of tile (mi, ni) is head mi·16 + g + (e / 2)·8, key ni·8 + t4·2 + e % 2.
        const i64 j0 = j_begin + (i64)kt * BN + wn * WN;
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            float sc[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float s = 0.f;
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int e = 0; e < 2; ++e) s += wh[mi][e] * fmaxf(acc[mi][ni][e * 2 + c], 0.f);
                s += __shfl_xor_sync(0xffffffffu, s, 4);
                s += __shfl_xor_sync(0xffffffffu, s, 8);
                s += __shfl_xor_sync(0xffffffffu, s, 16);
                sc[c] = s;
            }
            if (g == 0 && row < rows) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const i64 j = j0 + ni * 8 + t4 * 2 + c;
                    if (j < j_end) out[row * out_row + j] = j <= pos ? sc[c] : -INFINITY;
                }
            }
        }
        // Every warp is done with this stage before the next iteration refills it.
        __syncthreads();
    }
    // A block with no tile to compute still has its query copies in flight.
    cp_async_wait<0>();
    const i64 masked = j_begin + (i64)tiles * BN;
    for (i64 i = tid; i < (i64)ROWS * (j_end - min(masked, j_end)); i += THREADS) {
        const i64 span = j_end - masked;
        const i64 r = row0 + i / span;
        if (r < rows) out[r * out_row + masked + i % span] = -INFINITY;
    }
}
