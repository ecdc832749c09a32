#!/usr/bin/env bash
# Device call 0 of 2026-12-01 (seventh session), one H200, binaries of main (f1b58a2's kernels):
# Nsight Compute, from one `glmc bench` (sparse, batch 1, context 8192, prefill 4096), on the
# kernels this session's helpers work on: the prefill GEMM with a short K (q_b_proj, 128 × 128
# tile) next to one with a long K (o_proj, 256 × 128), the MoE skinny GEMMs at batch 1 (down
# and gate_up) and dsa.topk over one row of 8192 keys.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SourceCounters"
B=".gpu/glmc bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 1 --context 8192 --prefill 4096 --attention sparse"
# Compile once outside the profiler so every profiled run hits the cache.
timeout 150 $B --json "$R/bench.json" >"$R/bench.txt" 2>&1; log bench $?
prof() {
    timeout 120 $NCU --clock-control none -k "regex:$2" --launch-skip "$3" --launch-count 1 $S $B >"$R/ncu-$1.txt" 2>&1; log "$1" $?
}
prof qb_prefill glmc_gemm_mma_97a0e7da 1
prof o_prefill glmc_gemm_mma_36cde564 1
prof moe_down glmc_moe_gemm_skinny_5564888f 3
prof moe_gate_up glmc_moe_gemm_skinny_80ede216 3
prof topk glmc_dsa_topk_33ce89d1 5
