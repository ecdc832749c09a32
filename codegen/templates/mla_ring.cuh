{#- The deep key ring of mla_absorbed_few.cu and of mla_absorbed_wide.cu's deep form:
    mla_block.cuh's start with 16 threads a key (thread (lkey, lsub) copies latent vectors lsub,
    lsub + 16, … of key lkey, and its rope vector lsub when lsub < 8) and STAGES stages of BN = 16
    keys, over the split's 32-key tiles t0..t1 taken as 16-key tiles u0..u1 (the last may hold no
    key). ring_start() issues tiles u0 .. u0 + STAGES − 2, cp.async group i holding tile u0 + i
    (empty past u1). Once every thread has waited for tile u (cp_async_wait<STAGES − 2>) and passed
    the barrier that says every warp is done with tile u − 1, ring_refill(s, u) issues tile
    u + STAGES − 1 into the stage tile u − 1 held (one group, empty past u1); tile u is in stage
    s = (u − u0) % STAGES. Needs what mla_block.cuh needs but KEY_SHIFT. #}
    static_assert(BN == 16 && STAGES >= 2, "16-key stages, one computed while the rest land");
    constexpr int KEY_SHIFT = 4;
{% include "mla_block.cuh" %}
    const i64 u0 = 2 * t0, u1 = 2 * t1;
    // The cache row of this thread's key in the next tile to be issued, read a tile before.
    i64 jn;
    auto ring_start = [&]() {
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) {
            if (u0 + i < u1) load(i, key_of(u0 + i));
            cp_async_commit();
        }
        jn = key_of(u0 + STAGES - 1);
    };
    auto ring_refill = [&](int s, i64 u) {
        if (u + STAGES - 1 < u1) load(s == 0 ? STAGES - 1 : s - 1, jn);
        cp_async_commit();
        jn = key_of(u + STAGES);
    };
