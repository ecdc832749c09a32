#!/usr/bin/env bash
# Device call 0 of 2026-12-01 (sixth session), one H200, binaries of main (a9522f5's kernels):
# Nsight Compute on the absorbed attention at batch 1 (why one key costs ~9 µs) and on dsa.topk
# over one row of 8192 and 32768 keys (where its 19 and 52 µs go).
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
GLMC_GPU_OUT="$R/a" timeout 240 $NCU --clock-control none -k regex:mla_ --launch-count 10 $S \
    .gpu/gpu_kernels --ignored --nocapture --exact glm5_absorbed_attention_matches_and_is_timed >"$R/ncu-attention.txt" 2>&1; log attention $?
GLMC_GPU_OUT="$R/i" timeout 200 $NCU --clock-control none -k regex:dsa_topk --launch-count 4 $S --section SourceCounters \
    .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/ncu-topk.txt" 2>&1; log topk $?
