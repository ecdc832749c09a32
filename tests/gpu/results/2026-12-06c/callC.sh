#!/usr/bin/env bash
# Device call C of the twelfth session of 2026-12-06, on the device time left after calls A and
# B: issue 14's prefill GEMM protocol (`bench-gpu.sh run gemm`) if an H200 came; the tenth
# session measured it on an H100 only.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
grep -q "H200" "$R/times.txt" || { echo "not an H200: nothing run" | tee -a "$R/times.txt"; exit 0; }
OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 200 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
