#!/usr/bin/env bash
# Device call D of the thirteenth session of 2026-12-06, for an H200 only (on another GPU it stops
# at once): call C's build (the decode indexer with the head weights read first) in the bench,
# then the indexer test against main at 4c5e6f7 (.gpu/old/), the prefill GEMM protocol and the
# attention targets, while the session's device time lasts.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/i" "$R/io"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
grep -q H200 "$R/times.txt" || { log "not an H200, stopped" 0; exit 0; }
# The binaries travel as one xz archive, as in call A.
tar xJf .gpu/pack.tar.xz -C .gpu; log unpack $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 100 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
GLMC_GPU_OUT="$R/i" timeout 80 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
GLMC_GPU_OUT="$R/io" timeout 60 .gpu/old/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer-old.txt" 2>&1; log indexer-old $?
OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 200 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 90 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?
