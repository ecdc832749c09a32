// dsa.score: I(n, j) = Σ_h w[n,h] · relu(q[n,h]·k[j]) over {{ heads }} heads of {{ dim }} dims, −inf for
// j > position, w[n,h] first scaled by w_scale and rounded to w's dtype, as `scale` stores it
// (the folded head-weight scale; 1 when none). One block of 256 threads per query row and tile
// of {{ tile }} keys: the row's queries sit in shared memory as f32 (rows padded by one so that
// lane h reading head h hits a distinct bank; {{ heads }} × ({{ dim }} + 1) × 4 bytes, well under
// SM120's 99 KiB), each warp takes one key at a time, lane h dots head h with it (the key is a
// broadcast load) and the warp sums the weighted relus. The grid is rounded up; blocks past the
// last row exit.
extern "C" __global__ void __launch_bounds__(256, 1) {{ name }}(
    float* __restrict__ out, i64 out_row,
    const {{ q_t }}* __restrict__ q, i64 q_row, i64 q_head,
    const {{ w_t }}* __restrict__ w, i64 w_row, float w_scale,
    const {{ k_t }}* __restrict__ k, i64 k_seq, i64 k_key,
    const i64* __restrict__ positions, i64 rows, i64 keys{%- if slotted %},
    const i64* __restrict__ cache_slot, i64 k_slot{%- endif %})
{
    grid_dependency_control();
{%- if slotted %}
    // A prefill's caches are those of slot cache_slot[0]: the cache starts that many slots in
    // (0 apart for one held in the arena).
    k += cache_slot[0] * k_slot;
{%- endif %}
    constexpr int H = {{ heads }}, D = {{ dim }}, TILE = {{ tile }}, WARPS = 8;
    __shared__ float qs[H][D + 1];
    __shared__ float ws[H];
    const i64 tiles = (keys + TILE - 1) / TILE;
    if (tiles == 0) return;
    const i64 row = blockIdx.x / tiles;
    if (row >= rows) return;
    const i64 j0 = blockIdx.x % tiles * TILE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int e = tid; e < H * D; e += 256) qs[e / D][e % D] = ld(q + row * q_row + (e / D) * q_head + e % D);
    for (int e = tid; e < H; e += 256) ws[e] = rnd<{{ w_t }}>(ld(w + row * w_row + e) * w_scale);
    __syncthreads();
    const i64 pos = positions[row];
    const {{ k_t }}* kr = k + row * k_seq;
    for (int b = warp; b < TILE; b += WARPS) {
        const i64 j = j0 + b;
        if (j >= keys) break;
        float score = -INFINITY;
        if (j <= pos) {
            float s = 0.f;
            for (int h = lane; h < H; h += 32) {
                float dot = 0.f;
                for (int d = 0; d < D; ++d) dot += qs[h][d] * ld(kr + j * k_key + d);
                s += ws[h] * fmaxf(dot, 0.f);
            }
            score = warp_sum(s);
        }
        if (lane == 0) out[row * out_row + j] = score;
    }
}
