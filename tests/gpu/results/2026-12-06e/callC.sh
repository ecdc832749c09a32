#!/usr/bin/env bash
# Device call C of the fourteenth session of 2026-12-06, for an H200 only (on another GPU it stops
# at once): main's kernels (87d5b8c) in the two issue-14 targets never yet measured on an H200,
# the absorbed attention at batch 64 and the prefill GEMM protocol.
set -u
export GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
grep -q H200 "$R/times.txt" || { log "not an H200, stopped" 0; exit 0; }
tar xJf .gpu/pack.tar.xz -C .gpu; log unpack $?
OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 100 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?
OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 220 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
