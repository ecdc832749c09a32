{#- The key ring of mla_absorbed.cu and mla_absorbed_wide.cu: mla_block.cuh's start with 8
    threads a key and tiles of BN = 32 keys in two stages over the split's tiles t0..t1:
    ring_start() issues tiles t0 and t0 + 1, ring_next(s, t), once tile t is done with stage s,
    issues tile t + 2 into it (nothing past t1), and ring_wait(s, t) waits, in every thread, for
    tile t in stage s; a barrier after it makes the tile the block's. Plain: cp.async groups, 16
    bytes a thread. `bulk`: warp 0's lane k copies key k of a tile with two bulk copies (its
    latent and rope rows) that complete a transaction count on the stage's mbarrier. Needs what
    mla_block.cuh needs but KEY_SHIFT; `bulk` also 16 bytes of shared memory after the 2 · BN
    visibility flags, 8-byte aligned. #}
    static_assert(BN == 32, "mla_split.cuh tiles the keys by 32; bulk: warp 0's lanes are its keys");
    constexpr int KEY_SHIFT = 3;  // 8 threads a key
{% include "mla_block.cuh" %}
{%- if bulk %}
    // Why: at 64 heads on an H100 (Nsight Compute, tests/gpu/results/2026-12-07i/callA), 26% of
    // the warps' samples sat on the long scoreboard at a tile's first S MMA, whose registers
    // the compiler had just used for the addresses of the ring's 9 cp.async a thread (a likely
    // cause, not a measured one), and each of those copies cost 24 L2 sectors and 10.5 shared
    // wavefronts for an ideal 16 and 4. Two bulk copies a key take the gather off the threads
    // that compute.
    unsigned long long* const landed = reinterpret_cast<unsigned long long*>(visible + 2 * BN);
    const unsigned landed_at = smem_addr(landed);
    // A key that is not visible is not copied: its row keeps what an earlier tile (or the zeros
    // written here) left there, finite, and its probability is exactly zero.
    for (int v = tid; v < 2 * BN * LDK / 8; v += THREADS) reinterpret_cast<uint4*>(ks)[v] = make_uint4(0, 0, 0, 0);
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(landed_at));
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(landed_at + 8));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // The zeros are written before any bulk copy lands in the same rows.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    // Warp 0's lane's key in the next tile to be issued (key_at: lane k copies key k).
    i64 jn = -1;
    auto issue = [&](int stage, i64 j) {
        const bool ok = j >= 0 && j <= pos;
        visible[stage * BN + lane] = ok;
        const unsigned bar = landed_at + 8 * stage;
        const unsigned bytes = __popc(__ballot_sync(0xffffffffu, ok)) * D * 2;
        if (lane == 0)
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                         : "memory");
        __syncwarp();
        if (ok) {
            const unsigned dst = smem_addr(ks + (stage * BN + lane) * LDK);
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                ::"r"(dst), "l"(k1r + j * k1_key), "r"(D1 * 2), "r"(bar) : "memory");
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                ::"r"(dst + D1 * 2), "l"(k2r + j * k2_key), "r"((D - D1) * 2), "r"(bar) : "memory");
        }
    };
    auto ring_start = [&]() {
        if (warp == 0) {
            const i64 j0 = key_at(t0, lane), j1 = key_at(t0 + 1, lane);
            if (t0 < t1) issue(0, j0);
            if (t0 + 1 < t1) issue(1, j1);
            jn = key_at(t0 + 2, lane);
        }
        // mla_absorbed.cu's queries, copied by cp.async before this, land while the first tiles
        // are on their way.
        cp_async_commit();
        cp_async_wait<0>();
    };
    auto ring_next = [&](int stage, i64 t) {
        if (warp == 0) {
            if (t + 2 < t1) issue(stage, jn);
            jn = key_at(t + 3, lane);
        }
    };
    // Stage s holds tiles t0 + s, t0 + s + 2, …: its n-th use completes phase n of its mbarrier.
    auto ring_wait = [&](int stage, i64 t) {
        const unsigned bar = landed_at + 8 * stage, parity = (unsigned)((t - t0) >> 1) & 1;
        unsigned done = 0;
        while (!done)
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                " selp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    };
{%- else %}
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
    // Only the group of tile t + 1 may be outstanding.
    auto ring_wait = [&](int, i64) { cp_async_wait<1>(); };
{%- endif %}
