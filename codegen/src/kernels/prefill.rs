//! Tensor-core kernels for long prefills: dense expanded attention (`attention_flash.cu`) and the
//! indexer's scores (`dsa_score_mma.cu`, and `dsa_score_decode.cu` for a decode). Each returns why it does not apply, and the caller
//! keeps the baseline kernel then.

use super::{
    bf16_vectors, cache_operand, const_dim, float, int, per_head_rows, positions_ok,
    score_operands, Builder, Lowering, NodeCtx, Planned, ScoreOperands,
};
use crate::expr::{GridDim, Guard, Poly};
use crate::target::Target;

/// Query rows per block of the flash kernel (4 warps of 16) and keys per streamed tile; the
/// template fixes both.
const FLASH_ROWS: u64 = 64;
const FLASH_KEYS: u64 = 64;
/// The widest value head the flash kernel holds: its accumulator takes `dv / 2` registers a
/// thread, and 256 leaves room for the logits and addresses within 255.
const FLASH_MAX_DV: u64 = 256;

/// Keys per tile of the indexer kernel (the template's `BN`) and its warps.
const SCORE_KEYS: u64 = 128;
const SCORE_WARPS: u64 = 8;
/// Accumulator registers a thread may hold in the indexer kernel (`heads × rows / 2`).
const SCORE_MAX_ACC: u64 = 64;

/// What a block may use: the most SM120 gives one block, which the H200 also allows.
fn shared_limit() -> u64 {
    Target::Sm120.tile_shared_memory_limit() as u64
}

/// Bytes of a bf16 tile of `rows` rows of `dim` elements as the templates lay it out: rows of a
/// multiple of 64 elements swizzled in place, others padded by one 16-byte chunk.
fn tile_bytes(rows: u64, dim: u64) -> u64 {
    let chunks = dim / 8;
    rows * if chunks.is_multiple_of(8) {
        chunks
    } else {
        chunks + 1
    } * 16
}

/// Dense expanded `mla.attend` over a prefill's cache (one for all rows) with the flash kernel.
pub(super) fn flash_attention(cx: &NodeCtx, scale: f64) -> Result<Lowering, String> {
    let ops = cx.operands;
    let out = &cx.outputs[0];
    let (q1, q2, k1, k2, v, positions) = (&ops[0], &ops[1], &ops[2], &ops[3], &ops[4], &ops[5]);
    let (q1_row, q1_head, d1) = per_head_rows(q1, "the first query part")?;
    let (q2_row, q2_head, d2) = per_head_rows(q2, "the rope query part")?;
    let (out_row, out_head, dv) = per_head_rows(out, "the output")?;
    let heads = const_dim(q1, 1, "the first query part")?;
    let kc1 = cache_operand(k1, true, "the first key part")?;
    let kc2 = cache_operand(k2, false, "the rope key")?;
    let vc = cache_operand(v, true, "the values")?;
    if [&kc1.seq, &kc2.seq, &vc.seq]
        .iter()
        .any(|s| **s != Poly::zero())
    {
        return Err("the caches are per sequence (a decode), not one for all rows".into());
    }
    if !d1.is_multiple_of(8) || !d2.is_multiple_of(8) || !(d1 + d2).is_multiple_of(16) {
        return Err(format!(
            "query dims {d1}+{d2} are not 8-element parts of a multiple of 16"
        ));
    }
    if !dv.is_multiple_of(16) || dv > FLASH_MAX_DV {
        return Err(format!(
            "value dim {dv} is not a multiple of 16 up to {FLASH_MAX_DV}"
        ));
    }
    bf16_vectors(q1, &[&q1_row, &q1_head], "the first query part")?;
    bf16_vectors(q2, &[&q2_row, &q2_head], "the rope query part")?;
    bf16_vectors(k1, &[&kc1.key, &kc1.head], "the first key part")?;
    bf16_vectors(k2, &[&kc2.key], "the rope key")?;
    bf16_vectors(v, &[&vc.key, &vc.head], "the values")?;
    positions_ok(positions)?;
    let shared = tile_bytes(FLASH_ROWS, d1 + d2)
        + tile_bytes(FLASH_KEYS, d1 + d2)
        + tile_bytes(FLASH_KEYS, dv);
    if shared > shared_limit() {
        return Err(format!(
            "Q, K and V tiles take {shared} bytes of shared memory (at most {})",
            shared_limit()
        ));
    }
    let b = Builder::new("attention_flash", 128)
        .param("op", cx.node.op.name())
        .param("d1", d1)
        .param("d2", d2)
        .param("dv", dv)
        .param("heads", heads)
        .param("smem_kib", shared.div_ceil(1024))
        .dtype("out_t", out.dtype)?
        .shared(shared as u32, true);
    let rows = out.shape[0].clone();
    let mut args = vec![
        cx.ptr("out", out),
        int("out_row", out_row),
        int("out_head", out_head),
        cx.ptr("q1", q1),
        int("q1_row", q1_row),
        int("q1_head", q1_head),
        cx.ptr("q2", q2),
        int("q2_row", q2_row),
        int("q2_head", q2_head),
        cx.ptr("k1", k1),
        int("k1_key", kc1.key),
        int("k1_head", kc1.head),
        cx.ptr("k2", k2),
        int("k2_key", kc2.key),
        cx.ptr("v", v),
        int("v_key", vc.key),
        int("v_head", vc.head),
        cx.ptr("positions", positions),
        int("rows", rows.clone()),
        float("scale", scale),
    ];
    let b = cx.slotted(b, &mut args, &[("k1", k1), ("k2", k2), ("v", v)]);
    // Whole row tiles times the heads; blocks past the last row tile return at once.
    let grid = GridDim {
        work: rows
            .add(&Poly::constant(FLASH_ROWS as i64 - 1))
            .scale(heads as i64),
        per_block: FLASH_ROWS,
    };
    Ok(b.launch(grid, args))
}

/// `dsa.score` with bf16 queries and keys on the tensor cores, its head weights scaled by
/// `w_scale`.
pub(super) fn mma_score(cx: &NodeCtx, w_scale: f64) -> Result<Lowering, String> {
    let o = score_operands(cx, w_scale)?;
    let (heads, dim, kc) = (o.heads, o.dim, &o.kc);
    if !heads.is_multiple_of(16) || !dim.is_multiple_of(16) {
        return Err(format!(
            "{heads} heads of {dim} are not multiples of the 16 × 16 MMA tile"
        ));
    }
    bf16_vectors(o.q, &[&o.q_row, &o.q_head], "q")?;
    bf16_vectors(o.k, &[&kc.seq, &kc.key], "k")?;
    let persistent = if kc.seq != Poly::zero() {
        decode_score(cx, &o)?
    } else {
        None
    };
    // Its pointer arguments' sources, apart from the row-per-block kernel's.
    let persistent_sources = if persistent.is_some() {
        cx.sources.take()
    } else {
        Vec::new()
    };
    let shared_for = |r: u64| tile_bytes(r * heads, dim) + 2 * tile_bytes(SCORE_KEYS, dim);
    // Rows sharing a block share its key tiles, so a prefill takes as many as fit; a decode's
    // rows read caches of their own.
    let per_block = if kc.seq == Poly::zero() {
        [4, 2, 1]
            .into_iter()
            .find(|&r| heads * r / 2 <= SCORE_MAX_ACC && shared_for(r) <= shared_limit())
    } else {
        Some(1).filter(|_| heads / 2 <= SCORE_MAX_ACC && shared_for(1) <= shared_limit())
    }
    .ok_or_else(|| {
        format!("{heads} heads of {dim} do not fit one block's registers and shared memory")
    })?;
    // Enough keys a block that the queries are read rarely, few enough that a decode of one
    // sequence still spreads over the GPU.
    let tiles = if per_block > 1 { 4 } else { 2 };
    let chunk = tiles * SCORE_KEYS;
    let shared = shared_for(per_block);
    let b = Builder::new("dsa_score_mma", (SCORE_WARPS * 32) as u32)
        .param("heads", heads)
        .param("dim", dim)
        .param("rows", per_block)
        .param("tiles", tiles)
        .param("warp_keys", SCORE_KEYS * per_block / SCORE_WARPS)
        .param("smem_kib", shared.div_ceil(1024))
        .dtype("w_t", o.w.dtype)?
        .shared(shared as u32, true);
    let (b, args) = o.args(cx, b);
    // At least (row tiles) × (key chunks) blocks; the ones past the last row tile return.
    let grid = GridDim {
        work: o
            .rows
            .add(&Poly::constant(per_block as i64 - 1))
            .mul(&o.keys.add(&Poly::constant(chunk as i64 - 1))),
        per_block: per_block * chunk,
    };
    let mut per_row = b.planned(grid, args);
    let Some(mut persistent) = persistent else {
        return Ok(Lowering::Launch(per_row));
    };
    per_row.when = Some(Guard::at_most(o.rows.clone(), SCORE_DECODE_FEWEST_ROWS - 1));
    persistent.when = Some(Guard::above(o.rows.clone(), SCORE_DECODE_FEWEST_ROWS - 1));
    let per_row_sources = cx.sources.take();
    Ok(Lowering::Launches(vec![
        (per_row, per_row_sources),
        (persistent, persistent_sources),
    ]))
}

/// Blocks of the decode indexer kernel: as many as the target's SMs hold at once, so that the
/// whole persistent grid is resident (an H200: 2 × 132, two blocks of 96 KiB in its 228 KiB; an
/// RTX PRO 6000: 188, one each in 100 KiB).
fn score_decode_blocks(target: Target, shared: u64) -> u64 {
    u64::from(target.sm_count()) * target.blocks_fitting_shared_memory(shared)
}
/// Its ring of key tiles: `stages` tiles of `keys` keys (a multiple of 8 a warp), copied by each
/// thread's 16-byte cp.async. Two other ways to keep more of the stream in flight lost to it on
/// an H100 and an H200 (tests/gpu/README.md, the sixteenth session): five 64-key tiles by bulk
/// copies completing on mbarriers (21.1 µs against 20.7 at batch 8 × 32768 on the H200), and
/// each tile's copy asking L2 for the keys two tiles later (25.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoreRing {
    pub keys: u64,
    pub stages: u64,
}

/// As the indexer test names a ring: "3 × 128 keys".
impl std::fmt::Display for ScoreRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} × {} keys", self.stages, self.keys)
    }
}

impl ScoreRing {
    fn shared_bytes(&self, dim: u64) -> u64 {
        self.stages * tile_bytes(self.keys, dim)
    }
}
/// Three tiles of 128 keys: 96 KiB at GLM-5's 128 dims, two blocks an H200 SM. On an H200
/// (tests/gpu/results/2026-12-06c, call B), with a copy's index arithmetic general, six tiles of
/// 64 keys took 29.9 µs at batch 8 × 32768 and four 39.2, against 24.8 at three of 128. With the
/// copies' offsets fixed a thread and the first query through shared memory, on an H100
/// (tests/gpu/results/2026-12-06d, call C): six of 64 27.3 µs against 27.0 at batch 8 × 32768,
/// 55.1 against 52.6 at 64 × 8192, 21.9 against 19.8 ragged, and faster only at short contexts
/// (4.1 against 4.6 µs at 8 × 2048); on an H200 (2026-12-07b, call B) 21.0 against 20.7, 42.6
/// against 40.2 and 18.5 against 17.0.
pub const SCORE_DECODE_RING: ScoreRing = ScoreRing {
    keys: 128,
    stages: 3,
};
/// The other ring the indexer test times: six tiles of 64 keys, faster at short contexts.
pub const SCORE_RING_VARIANTS: [ScoreRing; 1] = [ScoreRing {
    keys: 64,
    stages: 6,
}];
/// Query registers a thread of it may hold (`heads × dim / 64`: GLM-5's 32 × 128 is 64).
const SCORE_DECODE_MAX_A: u64 = 64;
/// Rows from which a decode takes it. One sequence's keys are too few tiles to spread over its
/// fixed grid: on an H200 it took 9.1 µs for one row of 32768 keys where the row-per-block
/// kernel took 8.0, and 12.5 against 8.7 µs a layer in the batch-1 decode step at 1024
/// (tests/gpu/results/2026-12-01q), while at 8 rows of 32768 it took 24.9 µs against 41.2.
const SCORE_DECODE_FEWEST_ROWS: i64 = 2;

/// `dsa.score` with a cache per row (a decode) on `dsa_score_decode.cu`, or `None` where the
/// query fragments or the key ring do not fit (the row-per-block kernel takes those).
fn decode_score(cx: &NodeCtx, o: &ScoreOperands) -> Result<Option<Planned>, String> {
    let (heads, dim) = (o.heads, o.dim);
    let ring = cx.score_ring;
    let shared = ring.shared_bytes(dim);
    // The kernel counts tiles and keys in 32 bits.
    let keys_in_all = o.rows.mul(&o.keys).eval(cx.limits);
    // Its ldmatrix reads two 16-dim steps at once, its threads copy whole keys a pass, and the
    // first query is copied into one stage of the ring.
    if heads * dim / 64 > SCORE_DECODE_MAX_A
        || !dim.is_multiple_of(32)
        || !(SCORE_WARPS * 32).is_multiple_of(dim / 8)
        || heads > ring.keys
        || shared > shared_limit()
        || keys_in_all.is_none_or(|n| n > i64::from(i32::MAX))
    {
        return Ok(None);
    }
    let b = Builder::new("dsa_score_decode", (SCORE_WARPS * 32) as u32)
        .param("heads", heads)
        .param("dim", dim)
        .param("tile_keys", ring.keys)
        .param("stages", ring.stages)
        .param("a_regs", heads * dim / 64)
        .param("smem_kib", shared.div_ceil(1024))
        .dtype("w_t", o.w.dtype)?
        .shared(shared as u32, true);
    let (b, args) = o.args(cx, b);
    let blocks = score_decode_blocks(cx.target, shared);
    Ok(Some(b.planned(GridDim::fixed(blocks), args)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_of_a_multiple_of_64_are_swizzled_others_padded() {
        assert_eq!(tile_bytes(64, 256), 64 * 256 * 2);
        assert_eq!(tile_bytes(64, 48), 64 * (48 + 8) * 2);
    }

    #[test]
    fn the_persistent_indexer_grid_is_what_each_target_holds_at_once() {
        // GLM-5's 128 dims: 96 KiB of swizzled tiles.
        assert_eq!(SCORE_DECODE_RING.shared_bytes(128), 96 * 1024);
        for ring in std::iter::once(&SCORE_DECODE_RING).chain(&SCORE_RING_VARIANTS) {
            let shared = ring.shared_bytes(128);
            assert!(shared <= shared_limit(), "{ring:?}");
            assert_eq!(score_decode_blocks(Target::Sm90a, shared), 264, "{ring:?}");
            assert_eq!(score_decode_blocks(Target::Sm120a, shared), 188, "{ring:?}");
        }
    }

    #[test]
    fn a_ring_is_named_by_its_tiles() {
        let names: Vec<String> = SCORE_RING_VARIANTS.iter().map(|r| r.to_string()).collect();
        assert_eq!(names, ["6 × 64 keys"]);
        assert_eq!(SCORE_DECODE_RING.to_string(), "3 × 128 keys");
    }

    #[test]
    fn glm5_tiles_fit_sm120() {
        let flash = tile_bytes(64, 192 + 64) * 2 + tile_bytes(64, 256);
        assert_eq!(flash, 96 * 1024);
        assert!(flash <= shared_limit());
        let score = tile_bytes(4 * 32, 128) + 2 * tile_bytes(SCORE_KEYS, 128);
        assert_eq!(score, 96 * 1024);
    }
}
