#!/usr/bin/env bash
# Device call B of 2026-12-01 (fifth session), one H200: the merged perf branch (PDL, skinny GEMM tiles,
# absorbed attention ring, persistent indexer scoring): correctness first, then the timed kernels and the bench.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
( GLMC_GPU_OUT="$R/h" timeout 260 .gpu/gpu_kernels --ignored --test-threads=3 --nocapture \
    every_kernel_instance_matches_the_interpreter every_glm5_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 200 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
export GLMC_GPU_OUT="$R"
timeout 110 .gpu/gpu_kernels --ignored --nocapture --exact glm5_absorbed_attention_matches_and_is_timed >"$R/attention.txt" 2>&1; log attention $?
timeout 110 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
left=$((565 - (SECONDS - t0)))
OUT="$R/b" timeout $left scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
