{#- O ← O · correction + P · V for a tile of the kernels that keep their queries in registers
    (mla_absorbed_wide.cu, mla_absorbed_wide64.cu): warp w owns latent columns w·64.. of the
    MI 16-head row tiles. Needs MI, BN, LDP, LDK, V_AHEAD, o, corr, ps, kt, lane, warp and g. #}
        {
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                const float c0 = corr[mi * 16 + g], c1 = corr[mi * 16 + g + 8];
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
                    o[mi][nt][0] *= c0;
                    o[mi][nt][1] *= c0;
                    o[mi][nt][2] *= c1;
                    o[mi][nt][3] *= c1;
                }
            }
            const unsigned pa = smem_addr(ps + (lane & 15) * LDP + (lane >> 4) * 8);
            const unsigned vb = smem_addr(kt + ((lane & 7) + ((lane >> 3) & 1) * 8) * LDK + warp * 64 + (lane >> 4) * 8);
            static_assert(4 % V_AHEAD == 0, "the four column blocks in whole groups");
#pragma unroll
            for (int kk = 0; kk < BN; kk += 16) {
                // The A fragments of every 16-head row tile, then, V_AHEAD column blocks at a time
                // (all read before their MMAs), the values of columns warp·64 + j·16 (regs 0, 1)
                // and the next 8 (2, 3).
                unsigned a[MI][4];
#pragma unroll
                for (int mi = 0; mi < MI; ++mi) ldmatrix_x4(a[mi], pa + (mi * 16 * LDP + kk) * 2);
#pragma unroll
                for (int j0 = 0; j0 < 4; j0 += V_AHEAD) {
                    unsigned b[V_AHEAD][4];
#pragma unroll
                    for (int j = 0; j < V_AHEAD; ++j) ldmatrix_x4_trans(b[j], vb + (kk * LDK + (j0 + j) * 16) * 2);
#pragma unroll
                    for (int j = 0; j < V_AHEAD; ++j)
#pragma unroll
                        for (int mi = 0; mi < MI; ++mi) {
                            mma_bf16(o[mi][2 * (j0 + j)], a[mi], b[j][0], b[j][1]);
                            mma_bf16(o[mi][2 * (j0 + j) + 1], a[mi], b[j][2], b[j][3]);
                        }
                }
            }
        }
