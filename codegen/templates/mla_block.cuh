{#- Where every absorbed-MLA kernel's blocks start: their row, head group and split (returning where
    the split holds no key), the thread's place in its warp, and how its threads copy keys into a
    ring of BN-key stages (KEY_LANES = 2^KEY_SHIFT threads a key, each the latent vectors lsub, lsub
    + KEY_LANES, … and the rope vector lsub when lsub < 8, into ks rows LDK apart, with a `visible`
    flag per key of a stage): key_at(tile, k) is the cache row of key k of a BN-key tile (−1: none),
    key_of(tile) the thread's, load(stage, j) copies cache row j into its place in a stage. The
    split's 32-key tiles (mla_split.cuh) are t0..t1. Needs GROUPS, BN, KEY_SHIFT, D1, LDK and
    THREADS, ks and visible, and the kernel's arguments. #}
    const i64 blk = blockIdx.x;
    const int group = (int)(blk % GROUPS);
    const i64 split = (blk / GROUPS) % splits;
    const i64 row = blk / GROUPS / splits;
    if (row >= rows) return;
{% include "mla_split.cuh" %}
    // A split past the row's keys has nothing to write: the merge reads only the first `used`.
    if (split >= used) return;
    const i64 t0 = split * per, t1 = min(tiles, t0 + per);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
{%- if sparse %}
    const bool listed = pos + 1 > {{ dense_until }};  // as mla_split.cuh counts the keys
    const i64* const list = topk + row * topk_row;
{%- endif %}
    // A key that is not visible reads nothing, lands as zeros and is masked out of the softmax.
    constexpr int KEY_LANES = 1 << KEY_SHIFT;
    static_assert(THREADS == KEY_LANES * BN && D1 / 8 % KEY_LANES == 0 && KEY_LANES >= 8,
                  "KEY_LANES threads a key, the latent vectors shared evenly, one rope vector each");
    const int lkey = tid >> KEY_SHIFT, lsub = tid & (KEY_LANES - 1);
    const bf16* const k1r = k1 + row * k1_seq;
    const bf16* const k2r = k2 + row * k2_seq;
    // The cache row of key k of `tile` (−1: none), and of this thread's key. Its value is used a
    // tile later than it is read, so the read of a top-k entry is off the copy's critical path.
    auto key_at = [&](i64 tile, int k) -> i64 {
        const i64 slot = tile * BN + k;
        if (slot >= keys) return -1;
{%- if sparse %}
        if (listed) return list[slot];
{%- endif %}
        return slot;
    };
    auto key_of = [&](i64 tile) { return key_at(tile, lkey); };
    auto load = [&](int stage, i64 j) {
        const bool ok = j >= 0 && j <= pos;
        if (lsub == 0) visible[stage * BN + lkey] = ok;
        bf16* const dst = ks + (stage * BN + lkey) * LDK;
        const bf16* const a = k1r + (ok ? j : 0) * k1_key;
        const bf16* const b = k2r + (ok ? j : 0) * k2_key;
        constexpr int LATENT = D1 / 8 / KEY_LANES;
#pragma unroll
        for (int i = 0; i <= LATENT; ++i) {
            const int c = lsub + i * KEY_LANES;
            if (i < LATENT || lsub < 8) cp_async16(dst + c * 8, i < LATENT ? a + c * 8 : b + lsub * 8, ok);
        }
    };
