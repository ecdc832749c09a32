#!/usr/bin/env bash
# Device call 0b of 2026-12-01 (seventh session): Nsight Compute on dsa.topk over one row of 8192
# keys in the decode step of `glmc bench` (call 0 named the kernel by its hash in a local build;
# the bench's own build, for its limits, names it glmc_dsa_topk_292bcd84), with source counters.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters"
B=".gpu/glmc bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 1 --context 8192 --prefill 0 --attention sparse"
timeout 150 $NCU --clock-control none -k regex:glmc_dsa_topk --launch-skip 12 --launch-count 1 $S --print-details all $B >"$R/ncu-topk.txt" 2>&1
echo "topk: exit $?"
