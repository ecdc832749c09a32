// dsa.score for a decode on the tensor cores: I(n, j) = Σ_h w[n,h] · relu(q[n,h]·k[j]) over
// {{ heads }} heads of {{ dim }} dims, −inf for j > position, f32 throughout, w first scaled by
// w_scale and rounded to w's dtype as `scale` stores it (the folded head-weight scale; 1 when
// none). Each row reads a cache of its own, so the work is a stream of keys against a query a
// row: bandwidth bound.
//
// The grid is persistent (as many blocks as the target's SMs hold at once: two per SM of the
// H200, one on SM120): the rows' {{ tile_keys }}-key tiles, taken in (row, key) order, are split
// into one contiguous run per block, so every block streams about as many bytes, a block's run
// crosses a row boundary at most a few times, and a short decode (one row of 8192 keys) still
// spreads over the SMs. Setup is per row, not per block: the query's MMA fragments ({{ heads }} ×
// {{ dim }}, {{ a_regs }} registers a thread) and the head weights are read into registers when a
// tile of a new row comes up, while the key copies stay in flight (the first row's query through
// shared memory, a later row's from global memory: see below).
//
// Keys go through a {{ stages }}-stage ring of {{ tile_keys }}-key tiles ({{ smem_kib }}
// KiB, the only shared memory; rows of 8 16-byte chunks XOR-swizzled so ldmatrix reads no bank
// twice, others padded by one chunk): while one tile is multiplied the next {{ stages }} − 1 are
// in flight (64 KiB a block for GLM-5's 128 dims in the shipped ring, 128 KiB an SM at two
// blocks, past the ~32 KiB an SM that the H200's bandwidth × latency asks for). Keys past the
// row's position are not read: a tile wholly past it is −inf, written directly, with no copy and
// no MMA.
//
// Each warp takes an eighth of a tile's keys, {{ heads }} heads × 8 keys an m16n8k16 MMA, with
// the same register epilogue and summation order as `dsa_score_mma.cu` (relu, times w, summed
// over the thread's heads, then over lanes 4, 8 and 16 apart), so the two kernels give the same
// bits.
namespace {{ name }}_ {
constexpr int H = {{ heads }}, D = {{ dim }}, STAGES = {{ stages }};
constexpr int BN = {{ tile_keys }}, THREADS = 256, WARPS = 8, WN = BN / WARPS, NI = WN / 8;
constexpr int MI = H / 16, KK = D / 16, C = D / 8;
// Rows of 8 chunks are swizzled, others padded by a chunk.
constexpr bool PADDED = C % 8 != 0;
constexpr int ROW = (PADDED ? C + 1 : C) * 8, TILE = BN * ROW;
// A tile's copies: THREADS / C keys a pass, in passes that keep a thread's swizzle (the key's
// row mod 8) fixed.
constexpr int KEY_STEP = THREADS / C, PASSES = BN / KEY_STEP, S_STEP = KEY_STEP * ROW;
static_assert(THREADS % C == 0 && (C % 8 != 0 || KEY_STEP % 8 == 0), "the lowering checks dim");
static_assert(H <= BN, "the query fits a stage: the lowering checks heads");

__device__ __forceinline__ int at(int r, int c) {
    if constexpr (!PADDED) return r * ROW + (c ^ (r & 7)) * 8;
    else return r * ROW + c * 8;
}

// cp_async16 that also asks L2 to fetch the whole 256-byte block around the source: a key row
// of 128 dims is one such block, read whole by its 16 threads.
__device__ __forceinline__ void cp_async16_l2(void* smem, const void* global, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(global),
                 "r"(valid ? 16 : 0));
}

__device__ __forceinline__ unsigned ld_pair(const bf16* p) { return *reinterpret_cast<const unsigned*>(p); }
}  // namespace {{ name }}_

extern "C" __global__ void __launch_bounds__(256, 2) {{ name }}(
    float* __restrict__ out, i64 out_row,
    const bf16* __restrict__ q, i64 q_row, i64 q_head,
    const {{ w_t }}* __restrict__ w, i64 w_row, float w_scale,
    const bf16* __restrict__ k, i64 k_seq, i64 k_key,
    const i64* __restrict__ positions, i64 rows, i64 keys{%- if slotted %},
    const i64* __restrict__ cache_slot, i64 k_slot{%- endif %})
{
    grid_dependency_control();
{%- if slotted %}
    k += cache_slot[0] * k_slot;
{%- endif %}
    using namespace {{ name }}_;
    bf16* const sk = reinterpret_cast<bf16*>(dynamic_smem);
    // Tile and key indices fit 32 bits (the lowering checks rows × keys); 64-bit ones would cost
    // the registers that keep the query's fragments from spilling.
    const int per_row = (int)((keys + BN - 1) / BN), nkeys = (int)keys;
    const i64 total = rows * per_row;
    const int t_begin = (int)(total * blockIdx.x / gridDim.x);
    const int n = (int)(total * (blockIdx.x + 1) / gridDim.x) - t_begin;
    if (n <= 0) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;

    // Each thread copies 16-byte chunk c0 of keys r0, r0 + KEY_STEP, ... of a tile: its shared
    // and global offsets are fixed, so a tile's copies cost a pointer and a compare each (the
    // general index arithmetic cost about 200 instructions a thread a tile).
    const int c0 = tid % C, r0 = tid / C;
    const int s_off = at(r0, c0);
    const i64 g_off = (i64)r0 * k_key + c0 * 8, g_step = (i64)KEY_STEP * k_key;
    // The next tile to load, walked in (row, key) order: a division once, the row's last visible
    // key read once a row.
    int l_row = t_begin / per_row, l_j0 = t_begin % per_row * BN;
    int l_last = (int)min(positions[l_row], (i64)nkeys - 1);
    // The next tile's keys up to the row's position (past it zero-filled), nothing for a tile
    // wholly past it. Every thread takes the same branch: the cursor is the block's.
    auto load_next = [&](int stage) {
        if (l_j0 <= l_last) {
            const bf16* const src = k + l_row * k_seq + (i64)l_j0 * k_key + g_off;
            bf16* const dst = sk + stage * TILE + s_off;
            const int lim = l_last - l_j0 - r0;
#pragma unroll
            for (int u = 0; u < PASSES; ++u) {
                const bool ok = u * KEY_STEP <= lim;
                cp_async16_l2(dst + u * S_STEP, ok ? src + u * g_step : k, ok);
            }
        }
        l_j0 += BN;
        if (l_j0 >= nkeys) {
            l_j0 = 0;
            if (++l_row < rows) l_last = (int)min(positions[l_row], (i64)nkeys - 1);
        }
    };

    // Fragment (mi, kk) of the query: a0..a3 are heads mi·16 + g (+ 8 for a1, a3) at dims
    // kk·16 + t4·2 (+ 8 for a2, a3), the pairs ldmatrix gives.
    unsigned a[MI][KK][4];
    float wh[MI][2];
    auto load_weights = [&](int row) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int e = 0; e < 2; ++e) wh[mi][e] = rnd<{{ w_t }}>(ld(w + row * w_row + mi * 16 + g + e * 8) * w_scale);
    };
    // A later row's query, where a block's run crosses into it (a few blocks, once or twice):
    // from global memory, the ring's stages all taken by keys in flight.
    auto load_query = [&](int row) {
        load_weights(row);
        const bf16* const qr = q + row * q_row;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int kk = 0; kk < KK; ++kk) {
                const bf16* const p = qr + (mi * 16 + g) * q_head + kk * 16 + t4 * 2;
                a[mi][kk][0] = ld_pair(p);
                a[mi][kk][1] = ld_pair(p + 8 * q_head);
                a[mi][kk][2] = ld_pair(p + 8);
                a[mi][kk][3] = ld_pair(p + 8 * q_head + 8);
            }
    };

    // The tile multiplied next, walked like the loads from where they start, and the row whose
    // query the registers hold.
    int row = l_row, j_begin = l_j0, last = l_last, a_row = row;
    // The first row's query, which every block reads: copied whole, in 16-byte chunks, into the
    // ring's last stage (free until the loop's first refill) ahead of the first keys, and read
    // into fragments with ldmatrix. Read from global memory as the later rows' are, its 4-byte
    // pieces (64 loads a thread) filled the load queue and stalled every block's start.
    bf16* const sq = sk + (STAGES - 1) * TILE;
    // The head weights are read first: read after the first keys' copies, their loads came back
    // about when those did and held the loop's first refill (Nsight Compute on an H100: 18% of
    // the warps' samples waited on them).
    load_weights(row);
#pragma unroll
    for (int u = 0; u < (H * C + THREADS - 1) / THREADS; ++u) {
        const int i = tid + u * THREADS;
        if (H * C % THREADS == 0 || i < H * C)
            cp_async16(sq + at(i / C, i % C), q + row * q_row + i / C * q_head + i % C * 8, true);
    }
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n) load_next(s);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 1>();
    __syncthreads();
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) ldmatrix_x4(a[mi][kk], sq + at(mi * 16 + (lane & 15), kk * 2 + (lane >> 4)));
    for (int kt = 0; kt < n; ++kt) {
        if (kt > 0) {
            j_begin += BN;
            if (j_begin >= nkeys) {
                j_begin = 0;
                last = (int)min(positions[++row], (i64)nkeys - 1);
            }
        }
        cp_async_wait<STAGES - 2>();
        // Tile kt has landed for every thread, and every warp is done with tile kt - 1 (at the
        // first, with the query's copy), whose stage the next copy overwrites.
        __syncthreads();
        if (kt + STAGES - 1 < n) load_next((kt + STAGES - 1) % STAGES);
        cp_async_commit();

        const int j_end = min(j_begin + BN, nkeys);
        float* const orow = out + row * out_row;
        if (j_begin > last) {
            for (int j = j_begin + tid; j < j_end; j += THREADS) orow[j] = -INFINITY;
            continue;
        }
        if (row != a_row) {
            a_row = row;
            load_query(row);
        }

        const bf16* const tk = sk + (kt % STAGES) * TILE;
        // One 8-key MMA column at a time, so that only its accumulators are live next to the
        // query's fragments (both at once would not fit two blocks' registers an SM).
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            float acc[MI][1][4];
            zero_tiles(acc);
#pragma unroll
            for (int kk = 0; kk < KK; kk += 2) {
                // b0, b1 of step kk and of step kk + 1: lanes 8·m to 8·m + 7 address the 8 keys
                // at 16-byte chunk 2·kk + m.
                unsigned b[4];
                ldmatrix_x4(b, tk + at(warp * WN + ni * 8 + (lane & 7), kk * 2 + (lane >> 3)));
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int mi = 0; mi < MI; ++mi) mma_bf16(acc[mi][0], a[mi][kk + h], b[h * 2], b[h * 2 + 1]);
            }
            // Accumulator e of tile mi is head mi·16 + g + (e / 2)·8, key t4·2 + e % 2.
            float sc[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float s = 0.f;
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int e = 0; e < 2; ++e) s += wh[mi][e] * fmaxf(acc[mi][0][e * 2 + c], 0.f);
                s += __shfl_xor_sync(0xffffffffu, s, 4);
                s += __shfl_xor_sync(0xffffffffu, s, 8);
                s += __shfl_xor_sync(0xffffffffu, s, 16);
                sc[c] = s;
            }
            if (g == 0) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int j = j_begin + warp * WN + ni * 8 + t4 * 2 + c;
                    if (j < j_end) orow[j] = j <= last ? sc[c] : -INFINITY;
                }
            }
        }
    }
}
