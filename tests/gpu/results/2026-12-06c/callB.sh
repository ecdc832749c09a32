#!/usr/bin/env bash
# Device call B of the twelfth session of 2026-12-06: the decode indexer kernel's ring of six
# 64-key stages (shipped) against the three 128-key stages before it and four 64-key stages (the
# indexer test), Nsight Compute on it at batch 8 × 32k, the bench; the tiny harness next to the
# oracle; the skinny sweep with each shape's shipped variant also under plain launches.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
GLMC_GPU_OUT="$R" timeout 70 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
timeout 100 $NCU --clock-control none -k regex:dsa_score_decode --launch-count 2 $S \
    .gpu/glmc bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 8 --context 32768 \
    --prefill 0 --attention sparse --steps 1 --warmup 0 >"$R/ncu-score.txt" 2>&1; log ncu $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 90 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
( GLMC_GPU_OUT="$R/h" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 130 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/v" BENCH_RESULTS=/nonexistent timeout 200 scripts/bench-gpu.sh run gemv >"$R/gemv.txt" 2>&1; log gemv $?
