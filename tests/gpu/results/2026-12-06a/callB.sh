#!/usr/bin/env bash
# Device call B of the session of 2026-12-06: the rope epilogue without branches and in f32
# (gemm_head.cuh's rotate2; the tiled GEMM's branch on rotation taken once a warp), the tiled
# GEMM's tiles as call A measured (128 × 128 grouped by 16 below K = 2048, 256 × 128 grouped by
# 8 from it), the sweeps' positions drawn below GLM-5's 202752. The tiny harness next to the
# oracle, then issue 14's prefill GEMM protocol (`scripts/bench-gpu.sh run gemm`), the bench
# (`run glmc`) and the decode GEMM protocol (`run gemv`).
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o" "$R/g" "$R/b" "$R/v"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
( GLMC_GPU_OUT="$R/h" timeout 120 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 110 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 200 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 160 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
left=$((585 - (SECONDS - t0)))
OUT="$R/v" BENCH_RESULTS=/nonexistent timeout $left scripts/bench-gpu.sh run gemv >"$R/gemv.txt" 2>&1; log gemv $?
