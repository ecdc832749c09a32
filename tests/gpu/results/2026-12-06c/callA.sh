#!/usr/bin/env bash
# Device call A of the twelfth session of 2026-12-06: the tiny harness next to the oracle; issue
# 14's decode GEMM protocol with the skinny sweep's co-resident variants (a persistent grid of one
# block an SM at two blocks an SM's registers, so the next launch's blocks load their first
# weights beside it); the first GPU run of `bench-gpu.sh run attention`; the bench; the indexer test.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
( GLMC_GPU_OUT="$R/h" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 130 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/v" BENCH_RESULTS=/nonexistent timeout 230 scripts/bench-gpu.sh run gemv >"$R/gemv.txt" 2>&1; log gemv $?
OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 120 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 90 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
GLMC_GPU_OUT="$R" timeout 40 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
