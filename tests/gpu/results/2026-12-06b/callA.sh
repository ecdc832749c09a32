#!/usr/bin/env bash
# Device call A of the second session of 2026-12-06 (issue 14, the absorbed attention at 64
# heads): the wide kernel (mla_absorbed_wide.cu, 32 heads a block, queries in registers). The
# tiny and GLM-5 harnesses next to the oracle, the absorbed-attention test (the narrow kernel
# timed against the wide one at 64 heads), Nsight Compute on the wide kernel in a decode step at
# batch 64 × 32k, and the bench (`scripts/bench-gpu.sh run glmc`).
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/h5" "$R/o" "$R/a" "$R/b"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
( GLMC_GPU_OUT="$R/h" timeout 120 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
( GLMC_GPU_OUT="$R/h5" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_glm5_kernel_instance_matches_the_interpreter >"$R/harness-glm5.txt" 2>&1; log harness-glm5 $? ) &
GLMC_GPU_OUT="$R/o" timeout 110 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
GLMC_GPU_OUT="$R/a" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact \
    glm5_absorbed_attention_matches_and_is_timed >"$R/attention.txt" 2>&1; log attention $?
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
timeout 150 $NCU --clock-control none -k regex:mla_absorbed_wide --launch-count 2 $S \
    .gpu/glmc bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 64 --context 32768 \
    --prefill 0 --attention sparse --steps 1 --warmup 0 >"$R/ncu-wide.txt" 2>&1; log ncu $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 120 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
