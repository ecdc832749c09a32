#!/usr/bin/env bash
# Device call E of 2026-12-01 (eighth session), one H200, the final tree (gate/up back to one
# shape, the down projection's one-token shape kept): the bench, then the tiny harness.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 110 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
tar czf "$OUT/r.tgz" -C "$OUT" r
GLMC_GPU_OUT="$R/h" timeout 80 .gpu/gpu_kernels --ignored --nocapture --exact every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $?
