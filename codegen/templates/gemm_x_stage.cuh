{#- x staged in shared memory for the 16-row skinny GEMMs (gemm_skinny.cu's one-row-tile form and
    gemm_skinny_persistent.cu), where the parameter `x_rows` is set: stage_x(m0, h) copies the
    block's rows m0 .. m0 + {{ x_rows }} of head h (zeros past the last row) and says whether they
    were all its 16-row tile has; x_staged(ch, xq) is then load_x's fragments of chunk ch. Needs K, CHUNK,
    CHUNKS, WARPS, `warp`, `lane`, `g`, `t4`, `zero` and x's arguments. #}
    // Why: loaded from global memory a chunk ahead, x costs the indexer's wq_b (all eight chunks
    // of a warp's weights loaded before the wait) three to four dependent round trips to L2 after
    // the wait: its SASS on sm_90a issues a warp's x loads two chunks at a time, each pair after
    // the MMAs of the chunk before, where the read ceiling waits on nothing. A persistent block
    // (q_b_proj) loads a turn of its ring's x at once, a round trip per turn that the turn waits
    // for when its weights have landed first. Here the block copies its rows of x once, in one
    // round trip, and every fragment after that is a shared-memory load. A row is padded so that
    // it starts 16 banks after the one before: the eight lanes of an LDS.128 phase (rows g and
    // g + 1, four 16-byte pieces each) meet no bank twice.
    constexpr int X_ROWS = {{ x_rows }};
    constexpr int LDX = K + 2 * ((48 - K / 2 % 32) % 32), X_VECS = K / 8;
    static_assert(K % 8 == 0 && (X_ROWS == 8 || X_ROWS == 16) && X_ROWS % WARPS == 0,
                  "rows of whole 16-byte vectors, 8 or 16 of them, a warp's share of them whole");
    __shared__ __align__(16) bf16 xs[X_ROWS * LDX];
    // Every thread is done with what xs held before (the caller's barrier) when this is called.
    // Warp w copies rows w, w + 8, …, its lanes 512 contiguous bytes a copy, so a thread finds a
    // row's offset (an i64 division) once.
    auto stage_x = [&](i64 m0, int h) -> bool {
        // The 16-row tile's rows that hold rows.
        if (min(rows - m0, (i64)16) > X_ROWS) return false;
#pragma unroll
        for (int i = 0; i < X_ROWS / WARPS; ++i) {
            const int r = warp + i * WARPS;
            const bool ok = m0 + r < rows;
            const bf16* const src = x + (ok ? x_offset(m0 + r, h, x_outer, x_row, x_inner_rows, x_head) : 0);
#pragma unroll
            for (int j = 0; j < (X_VECS + 31) / 32; ++j) {
                const int c = lane + 32 * j;
                if (c < X_VECS) cp_async16(xs + r * LDX + c * 8, src + c * 8, ok);
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        return true;
    };
    auto x_staged = [&](int ch, uint4 (&xq)[2]) {
        const int k0 = ch * CHUNK;
        const bool in_k = ch < CHUNKS && k0 + t4 * 8 < K;
        const bf16* const at = xs + g * LDX + (in_k ? k0 : 0) + t4 * 8;
        xq[0] = in_k ? *reinterpret_cast<const uint4*>(at) : zero;
        xq[1] = X_ROWS > 8 && in_k ? *reinterpret_cast<const uint4*>(at + 8 * LDX) : zero;
    };
