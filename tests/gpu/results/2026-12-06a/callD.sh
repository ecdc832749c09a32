#!/usr/bin/env bash
# Device call D of the session of 2026-12-06: call C's tree with the tiled GEMM's output columns
# worked out once a thread, not once a row (with rope, the permuted columns' map cost the
# epilogue more instructions than the rotation: Nsight Compute in call C). The tiny harness
# next to the oracle, issue 14's prefill GEMM protocol (`scripts/bench-gpu.sh run gemm`) and the
# bench (`run glmc`).
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o" "$R/g" "$R/b"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
( GLMC_GPU_OUT="$R/h" timeout 120 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 110 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 190 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 120 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
