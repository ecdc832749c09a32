{#- Where both absorbed-MLA kernels' blocks start: their row, head group and split (returning
    where the split holds no key tile), the thread's place in its warp, and the key ring they
    fill (8 threads a key, tiles of BN = 32 keys of D1 + 64 dims in ks, rows LDK apart,
    `visible` flags per stage) over the split's tiles t0..t1:
    ring_start() issues tiles t0 and t0 + 1 as cp.async groups, ring_next(s, t), once tile t is
    done with stage s, issues tile t + 2 into it (a group, empty past t1). Needs GROUPS, BN, D1,
    D, VECS, LDK and THREADS, ks and visible, and the kernel's arguments. #}
    const i64 blk = blockIdx.x;
    const int group = (int)(blk % GROUPS);
    const i64 split = (blk / GROUPS) % splits;
    const i64 row = blk / GROUPS / splits;
    if (row >= rows) return;
{% include "mla_split.cuh" %}
    static_assert(BN == 32, "mla_split.cuh tiles the keys by 32");
    // A split past the row's keys has nothing to write: the merge reads only the first `used`.
    if (split >= used) return;
    const i64 t0 = split * per, t1 = min(tiles, t0 + per);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
{%- if sparse %}
    const bool listed = pos + 1 > {{ dense_until }};  // as mla_split.cuh counts the keys
    const i64* const list = topk + row * topk_row;
{%- endif %}
    // Each key of a tile is copied by 8 threads, 9 vectors each (64 latent, 8 rope); a key that
    // is not visible reads nothing, lands as zeros and is masked out of the softmax.
    static_assert(THREADS == 8 * BN, "8 threads a key");
    const int lkey = tid >> 3, lsub = tid & 7;
    const bf16* const k1r = k1 + row * k1_seq;
    const bf16* const k2r = k2 + row * k2_seq;
    // The cache row of this thread's key in `tile` (−1: none). Its value is used a tile later
    // than it is read, so the read of a top-k entry is off the copy's critical path.
    auto key_of = [&](i64 tile) -> i64 {
        const i64 slot = tile * BN + lkey;
        if (slot >= keys) return -1;
{%- if sparse %}
        if (listed) return list[slot];
{%- endif %}
        return slot;
    };
    auto load = [&](int stage, i64 j) {
        const bool ok = j >= 0 && j <= pos;
        if (lsub == 0) visible[stage * BN + lkey] = ok;
        bf16* const dst = ks + (stage * BN + lkey) * LDK;
        const bf16* const a = k1r + (ok ? j : 0) * k1_key;
        const bf16* const b = k2r + (ok ? j : 0) * k2_key;
#pragma unroll
        for (int i = 0; i < VECS / 8; ++i) {
            const int c = lsub + i * 8;
            cp_async16(dst + c * 8, i < D1 / 64 ? a + c * 8 : b + lsub * 8, ok);
        }
    };

    // The cache row of this thread's key in tile t + 2, read a tile before it is copied.
    i64 jn;
    auto ring_start = [&]() {
        const i64 j0 = key_of(t0), j1 = key_of(t0 + 1);
        if (t0 < t1) load(0, j0);
        cp_async_commit();
        if (t0 + 1 < t1) load(1, j1);
        cp_async_commit();
        jn = key_of(t0 + 2);
    };
    auto ring_next = [&](int stage, i64 t) {
        if (t + 2 < t1) load(stage, jn);
        cp_async_commit();
        jn = key_of(t + 3);
    };
