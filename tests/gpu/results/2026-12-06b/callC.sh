#!/usr/bin/env bash
# Device call C of the second session of 2026-12-06: the L2 prefetch of call B taken out (no
# faster at 64 heads, slower at 8), the wide kernel on 16 warps (126 registers; 194 at 8 warps).
# The tiny harness next to the oracle and the GLM-5 harness, the absorbed-attention test and the
# bench.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/h5" "$R/o" "$R/a" "$R/b"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
( GLMC_GPU_OUT="$R/h" timeout 120 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
( GLMC_GPU_OUT="$R/h5" timeout 130 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_glm5_kernel_instance_matches_the_interpreter >"$R/harness-glm5.txt" 2>&1; log harness-glm5 $? ) &
GLMC_GPU_OUT="$R/o" timeout 110 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
GLMC_GPU_OUT="$R/a" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact \
    glm5_absorbed_attention_matches_and_is_timed >"$R/attention.txt" 2>&1; log attention $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 120 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
