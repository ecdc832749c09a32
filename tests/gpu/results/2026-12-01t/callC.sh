#!/usr/bin/env bash
# Device call C of 2026-12-01 (eighth session), one H200, branch integ after call B (score8 and
# the MoE column variants reverted; the sampler test's tie row at top-p 0.3): the sampler's test,
# the tiny and GLM-5 harnesses next to the oracle, then the bench.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
GLMC_GPU_OUT="$R" timeout 90 .gpu/gpu_kernels --ignored --nocapture --exact top_p_sampling_on_the_gpu_has_the_nucleus_distribution >"$R/sampling.txt" 2>&1; log sampling $?
( GLMC_GPU_OUT="$R/h" timeout 270 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter every_glm5_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 120 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 180 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
