// {{ op }} at decode in bf16, few rows per expert: routed rows [n·k, {{ n }}] = h[r] · downᵀ with
// the weights [E, {{ n }}, {{ k }}] of the expert owning row r, in FP32 FMA. The same work items
// and sums as `moe_gemm_skinny.cu` (a run of up to ROWS = {{ rows }} rows of one expert; one grid slot
// per routed row and column tile, working only where its row starts a run), in tiles of
// COLS = {{ cols }} columns, so that a block's fixed cost (the wait for the kernel before, the expert
// lookup, the rows of h) is paid once for COLS × K weights instead of 16 × K: at one token
// moe.down's 16-column blocks spent about a third of their life with no weight load in flight
// (67% of the copy roofline on an H200, against gate/up's 89% with twice the loads a step).
// Warp w takes the column pairs n0 + 2w + 16j, j = 0, 1, …: the block's eight warps read 16
// adjacent weight rows at a time. A lane keeps DEPTH = {{ depth }} steps (two 16-byte loads each, one
// per column) in flight as a ring of raw registers refilled as each step is multiplied, across
// the pair boundary: the next pair's first steps are on their way while a pair is summed over
// the warp and stored, so a warp's stream of weights never drains until its last pair. Each
// column's sum is taken in the order of `moe_gemm_skinny.cu`, lane by lane over ascending k, then
// over the warp, so both kernels give the same bits. The run's rows of h sit in shared memory
// (ROWS × K bf16), copied once while the first weight loads are on their way.
extern "C" __global__ void __launch_bounds__(256, {{ min_blocks }}) {{ name }}(
    {{ y_t }}* __restrict__ y,
    const bf16* __restrict__ x, i64 x_row,
    const i64* __restrict__ offsets,
    const bf16* __restrict__ w0)
{
    grid_dependency_control();
    constexpr int K = {{ k }}, N = {{ n }}, E = {{ experts }};
    constexpr int ROWS = {{ rows }}, COLS = {{ cols }}, DEPTH = {{ depth }}, TILES = (N + COLS - 1) / COLS;
    // A step is 32 lanes × 8 elements of K; a lane's elements of step s start at 256 s + 8 lane.
    constexpr int STEPS = (K + 255) / 256, PAIRS = COLS / 16;
    constexpr bool WHOLE_STEPS = K % 256 == 0;
    static_assert(K % 8 == 0 && COLS % 16 == 0, "16-byte vectors of K, column pairs for 8 warps");
    static_assert(STEPS % DEPTH == 0, "a ring slot holds the same step of every pair");
    __shared__ __align__(16) bf16 xs[ROWS * K];
    __shared__ i64 run_start, run_end;
    __shared__ int run_expert;
    const i64 slot = blockIdx.x / TILES;
    const int n0 = (int)(blockIdx.x % TILES) * COLS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    // The expert owning row `slot`, the one e with offsets[e] <= slot < offsets[e + 1] (empty
    // experts own nothing): each thread tests one expert, both its offsets loaded together, so
    // the weights' address is known one L2 round trip after the wait, not two.
    bool owner = false;
    for (int e0 = 0; e0 < E; e0 += {{ threads }}) {
        const int e = e0 + tid;
        if (e < E) {
            const i64 a = offsets[e], b = offsets[e + 1];
            if (a <= slot && slot < b) {
                run_expert = e;
                run_start = a;
                run_end = b;
                owner = true;
            }
        }
    }
    if (!__syncthreads_or(owner)) return;
    const i64 start = run_start, end = run_end;
    if ((slot - start) % ROWS != 0) return;
    const int m = (int)min((i64)ROWS, end - slot);

    const bf16* we = w0 + (i64)run_expert * N * K;
    const int first = n0 + 2 * warp;
    const int pairs = first < N ? min(PAIRS, (N - first + 15) / 16) : 0;
    // Pair j's first column and the distance to its second: an odd N's last pair has one
    // column, which it reads twice and stores once, as the skinny kernel does. Past the warp's
    // pairs nothing is loaded, but the column is clamped inside the expert's weights anyway (to
    // N - 2 where N is even, so the second column is always K further on), so a load the
    // compiler issues ahead of its condition cannot fault.
    struct Pair {
        const bf16* w;
        int second;
        bool ok;
    };
    auto pair = [&](int j) {
        const int c = min(first + 16 * j, N % 2 == 0 ? N - 2 : N - 1);
        return Pair{we + (i64)c * K, N % 2 == 0 || c + 1 < N ? K : 0, j < pairs};
    };
    // Step s of a pair into a ring slot (nothing past K, where the address is clamped too).
    auto fetch = [&](const Pair& p, int s, uint4 (&q)[2]) {
        const int k0 = s * 256 + lane * 8;
        const bf16* at = p.w + (WHOLE_STEPS ? k0 : min(k0, K - 8));
        if (p.ok && (WHOLE_STEPS || k0 < K)) {
            q[0] = ld_stream16<256>(at);
            q[1] = ld_stream16<256>(at + p.second);
        }
    };
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 ring[DEPTH][2];
    Pair now = pair(0);
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
        ring[d][0] = zero;
        ring[d][1] = zero;
        fetch(now, d, ring[d]);
    }
    // The run's rows of h; 16-byte copies (the lowering checks rows start on 16 bytes).
    for (int c = tid; c < m * (K / 8); c += {{ threads }}) {
        const int i = c / (K / 8), k = c % (K / 8) * 8;
        cp_async16(xs + i * K + k, x + (slot + i) * x_row + k, true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // A ring slot's raw bf16 pairs to f32 (exact), element 2i in the low half as in memory.
    auto unpack = [](const uint4& q, float (&f)[8]) {
        const unsigned u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    };
    for (int j = 0; j < pairs; ++j) {
        const Pair next = pair(j + 1);
        float acc[2][ROWS];
#pragma unroll
        for (int cc = 0; cc < 2; ++cc)
#pragma unroll
            for (int i = 0; i < ROWS; ++i) acc[cc][i] = 0.f;
#pragma unroll
        for (int s = 0; s < STEPS; ++s) {
            const int d = s % DEPTH, k0 = s * 256 + lane * 8;
            if (WHOLE_STEPS || k0 < K) {
                float wv[2][8];
                unpack(ring[d][0], wv[0]);
                unpack(ring[d][1], wv[1]);
#pragma unroll
                for (int i = 0; i < ROWS; ++i) {
                    if (i < m) {
                        float xv[8];
                        ld_vec<bf16, 8>(xs + i * K + k0, xv);
#pragma unroll
                        for (int cc = 0; cc < 2; ++cc)
#pragma unroll
                            for (int v = 0; v < 8; ++v) acc[cc][i] = fmaf(wv[cc][v], xv[v], acc[cc][i]);
                    }
                }
            }
            // The slot just used takes the step DEPTH further on, in the next pair past the last
            // step of this one (the same slot: STEPS is a multiple of DEPTH).
            if (s + DEPTH < STEPS)
                fetch(now, s + DEPTH, ring[d]);
            else
                fetch(next, s + DEPTH - STEPS, ring[d]);
        }
        const int c0 = first + 16 * j;
        const bool two = c0 + 1 < N;
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
            if (cc == 1 && !two) break;
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                if (i >= m) break;
                const float a = warp_sum(acc[cc][i]);
                if (lane == 0) st(y + (slot + i) * N + c0 + cc, a);
            }
        }
        now = next;
    }
}
