#!/usr/bin/env bash
# Device call A of the session of 2026-12-06, one H200: the tiled GEMM's rope epilogue reads a
# row's position once (not once a column pair) and the sweep times new tiles (64 × 128, the
# grouped 128 × 128 and 256 × 128). The tiny harness next to the oracle (every rope GEMM
# checked), then issue 14's prefill GEMM protocol: the tiled sweep and torch.matmul on its
# shapes (`scripts/bench-gpu.sh run gemm`).
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o" "$R/g"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
( GLMC_GPU_OUT="$R/h" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 130 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
left=$((570 - (SECONDS - t0)))
OUT="$R/g" BENCH_RESULTS=/nonexistent timeout $left scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
