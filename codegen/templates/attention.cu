// {{ op }}: one query row and head per block of 128 threads; logit(j) = scale · (q1·k1(j) +
// q2·k2(j)) over {{ d1 }} + {{ d2 }} dims, output Σ_j softmax(logit)_j · v(j) over {{ dv }} dims,
// for the keys j ≤ position{% if sparse %} that the row's {{ topk }} top-k entries name (−1 and
// repeats ignored; a row with at most {{ dense_until }} keys sees all of them, the dense_until
// rule){% endif %}. Keys go by in chunks of 32 (one bit each{% if sparse %} in a shared bitmap of
// the selected keys, {{ words }} words for the cache's capacity{% endif %}): each warp dots its keys
// with the query held in shared memory and reduces over lanes, then every thread applies the
// online-softmax update to its {{ items }} value dims, in f32. Shared memory stays a few KiB (SM120
// allows 99 KiB), and a chunk without a visible key costs no barrier. A row that sees no key
// gets zeros.
extern "C" __global__ void __launch_bounds__(128, 1) {{ name }}(
    {{ out_t }}* __restrict__ out, i64 out_row, i64 out_head,
    const {{ q1_t }}* __restrict__ q1, i64 q1_row, i64 q1_head,
    const {{ q2_t }}* __restrict__ q2, i64 q2_row, i64 q2_head,
    const {{ k1_t }}* __restrict__ k1, i64 k1_seq, i64 k1_key, i64 k1_head,
    const {{ k2_t }}* __restrict__ k2, i64 k2_seq, i64 k2_key,
    const {{ v_t }}* __restrict__ v, i64 v_seq, i64 v_key, i64 v_head,
    const i64* __restrict__ positions,
{%- if sparse %}
    const i64* __restrict__ topk, i64 topk_row,
{%- endif %}
    i64 rows, float scale{%- if slotted %},
    const i64* __restrict__ cache_slot, i64 k1_slot, i64 k2_slot, i64 v_slot{%- endif %})
{
    grid_dependency_control();
{%- if slotted %}
    // A prefill's caches are those of slot cache_slot[0]: each cache starts that many slots in
    // (0 apart for one held in the arena).
    k1 += cache_slot[0] * k1_slot;
    k2 += cache_slot[0] * k2_slot;
    v += cache_slot[0] * v_slot;
{%- endif %}
    constexpr int D1 = {{ d1 }}, D2 = {{ d2 }}, DV = {{ dv }}, HEADS = {{ heads }};
    constexpr int THREADS = 128, WARPS = THREADS / 32, ITEMS = {{ items }};
    __shared__ float qs[D1 + D2];
    __shared__ float logit[32];
{%- if sparse %}
    constexpr int TOPK = {{ topk }}, WORDS = {{ words }};
    constexpr i64 DENSE_UNTIL = {{ dense_until }};
    __shared__ unsigned selected[WORDS];
{%- endif %}

    const i64 row = blockIdx.x / HEADS;
    const int h = blockIdx.x % HEADS;
    if (row >= rows) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const i64 pos = positions[row];
    const i64 chunks = pos / 32 + 1;

    for (int d = tid; d < D1; d += THREADS) qs[d] = ld(q1 + row * q1_row + h * q1_head + d);
    for (int d = tid; d < D2; d += THREADS) qs[D1 + d] = ld(q2 + row * q2_row + h * q2_head + d);
    const {{ k1_t }}* k1r = k1 + row * k1_seq + h * k1_head;
    const {{ k2_t }}* k2r = k2 + row * k2_seq;
    const {{ v_t }}* vr = v + row * v_seq + h * v_head;
{%- if sparse %}
    const bool all_keys = pos + 1 <= DENSE_UNTIL;
    if (!all_keys) {
        for (i64 c = tid; c < chunks && c < WORDS; c += THREADS) selected[c] = 0u;
        __syncthreads();
        for (int slot = tid; slot < TOPK; slot += THREADS) {
            const i64 j = topk[row * topk_row + slot];
            if (j >= 0 && j <= pos && (j >> 5) < WORDS) atomicOr(&selected[j >> 5], 1u << (j & 31));
        }
    }
{%- endif %}
    __syncthreads();

    float m = -INFINITY, l = 0.f, acc[ITEMS] = {};
    for (i64 c = 0; c < chunks; ++c) {
        const i64 last = pos - c * 32;
        unsigned mask = last >= 31 ? 0xffffffffu : (1u << (last + 1)) - 1u;
{%- if sparse %}
        if (!all_keys) mask &= c < WORDS ? selected[c] : 0u;
{%- endif %}
        if (mask == 0u) continue;
        for (int b = warp; b < 32; b += WARPS) {
            if (!((mask >> b) & 1u)) continue;
            const i64 j = c * 32 + b;
            float part = 0.f;
            for (int d = lane; d < D1; d += 32) part += qs[d] * ld(k1r + j * k1_key + d);
            for (int d = lane; d < D2; d += 32) part += qs[D1 + d] * ld(k2r + j * k2_key + d);
            part = warp_sum(part);
            if (lane == 0) logit[b] = part * scale;
        }
        __syncthreads();
        float chunk_max = -INFINITY;
        for (int b = 0; b < 32; ++b)
            if ((mask >> b) & 1u) chunk_max = fmaxf(chunk_max, logit[b]);
        const float m_new = fmaxf(m, chunk_max);
        const float correction = expf(m - m_new);
        l *= correction;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) acc[i] *= correction;
        for (int b = 0; b < 32; ++b) {
            if (!((mask >> b) & 1u)) continue;
            const float p = expf(logit[b] - m_new);
            const {{ v_t }}* vj = vr + (c * 32 + b) * v_key;
            l += p;
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) {
                const int d = tid + i * THREADS;
                if (d < DV) acc[i] += p * ld(vj + d);
            }
        }
        m = m_new;
        __syncthreads();
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int d = tid + i * THREADS;
        if (d < DV) st(out + row * out_row + h * out_head + d, acc[i] * inv);
    }
}
