{#- The score MMAs of the kernels that keep their queries in registers (mla_absorbed_wide.cu,
    mla_absorbed_wide64.cu), for the warp's 16 heads qhead.. of the group over its KSTEPS · 16
    dims qdim..: the queries' A fragments, and scores(kt, acc). Needs qhead, qdim, KSTEPS, HG,
    D1, LDK and the kernel's arguments. #}
    // The A fragments of heads qhead + g (and + 8) over dims qdim + i·16.., read from global
    // memory once: a0/a1 the first 8 dims of rows g and g + 8, a2/a3 the next 8.
    unsigned qa[KSTEPS][4];
    {
        const i64 h = group * HG + qhead + g;
        const bf16* const r1 = q1 + row * q1_row + h * q1_head;
        const bf16* const r2 = q2 + row * q2_row + h * q2_head;
        const i64 h8_1 = 8 * q1_head, h8_2 = 8 * q2_head;
#pragma unroll
        for (int i = 0; i < KSTEPS; ++i) {
            const int c = qdim + i * 16 + t4 * 2;
            const bf16* const p = c < D1 ? r1 + c : r2 + (c - D1);
            const i64 h8 = c < D1 ? h8_1 : h8_2;
            qa[i][0] = *reinterpret_cast<const unsigned*>(p);
            qa[i][1] = *reinterpret_cast<const unsigned*>(p + h8);
            qa[i][2] = *reinterpret_cast<const unsigned*>(p + 8);
            qa[i][3] = *reinterpret_cast<const unsigned*>(p + h8 + 8);
        }
    }
    // The warp's heads × the 32 keys of the stage at kt over its dims, into acc[nt] (keys nt·8..),
    // the next k step's key fragments read before this step's MMAs.
    auto scores = [&](const bf16* kt, float (&acc)[4][4]) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
        // b[i % 2][p]: k step i's fragments of key tiles 2p (regs 0, 1) and 2p + 1 (2, 3).
        unsigned b[2][2][4];
        const unsigned kb = smem_addr(kt + ((lane >> 4) * 8 + (lane & 7)) * LDK + qdim + ((lane >> 3) & 1) * 8);
        auto fetch = [&](unsigned (&r)[2][4], int i) {
            ldmatrix_x4(r[0], kb + i * 32);
            ldmatrix_x4(r[1], kb + i * 32 + 16 * LDK * 2);
        };
        fetch(b[0], 0);
#pragma unroll
        for (int i = 0; i < KSTEPS; ++i) {
            if (i + 1 < KSTEPS) fetch(b[(i + 1) & 1], i + 1);
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                mma_bf16(acc[2 * p], qa[i], b[i & 1][p][0], b[i & 1][p][1]);
                mma_bf16(acc[2 * p + 1], qa[i], b[i & 1][p][2], b[i & 1][p][3]);
            }
        }
    };
