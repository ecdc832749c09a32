{#- The key ring of mla_absorbed.cu and mla_absorbed_wide.cu: mla_block.cuh's start with 8
    threads a key and tiles of BN = 32 keys in two stages over the split's tiles t0..t1:
    ring_start() issues tiles t0 and t0 + 1 as cp.async groups, ring_next(s, t), once tile t is
    done with stage s, issues tile t + 2 into it (a group, empty past t1). Needs what
    mla_block.cuh needs but KEY_SHIFT. #}
    static_assert(BN == 32, "mla_split.cuh tiles the keys by 32");
    constexpr int KEY_SHIFT = 3;  // 8 threads a key
{% include "mla_block.cuh" %}
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
