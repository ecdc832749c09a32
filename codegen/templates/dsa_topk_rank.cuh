{#- Statements both dsa.topk kernels rank the cut bin's candidates with: the `in_cut` order-keys
    in `cand`, `want` of them to take. g threads a candidate (as many as the block's threads
    allow), each comparing it with every g-th other; exactly one candidate has want − 1 better
    ones, counting equal ones in list order, and it sets `threshold` and `ties` (through `sel`). #}
        {
            const int c = (int)in_cut;
            int g = 32;
            while (g * c > (int)blockDim.x) g >>= 1;
            const int i = tid / g, part = tid % g;
            const unsigned ui = i < c ? cand[i] : 0u;
            unsigned better = 0u, earlier = 0u;
            if (i < c) {
                for (int j = part; j < c; j += g) {
                    const unsigned uj = cand[j];
                    better += uj > ui;
                    earlier += uj == ui && j < i;
                }
            }
            for (int d = g >> 1; d > 0; d >>= 1) {
                better += __shfl_xor_sync(0xffffffffu, better, d);
                earlier += __shfl_xor_sync(0xffffffffu, earlier, d);
            }
            if (part == 0 && i < c && better + earlier == want - 1) {
                sel[0] = ui;
                sel[1] = want - better;
            }
            __syncthreads();
            threshold = sel[0];
            ties = sel[1];
        }
