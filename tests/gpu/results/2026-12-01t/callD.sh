#!/usr/bin/env bash
# Device call D of 2026-12-01 (eighth session), one H200, the final tree (integ with the MoE
# skinny GEMM's one-token shape): the tiny and GLM-5 harnesses next to the oracle, then the
# bench and the MoE decode test.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
( GLMC_GPU_OUT="$R/h" timeout 270 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter every_glm5_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 120 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 150 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
GLMC_GPU_OUT="$R" timeout 100 .gpu/gpu_kernels --ignored --nocapture --exact glm5_moe_grouped_gemms_match_the_interpreter_and_are_timed >"$R/moe.txt" 2>&1; log moe $?
