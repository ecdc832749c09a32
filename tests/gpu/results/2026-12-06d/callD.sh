#!/usr/bin/env bash
# Device call D of the thirteenth session of 2026-12-06, for an H200 only (on another GPU it stops
# at once): call C's build (the decode indexer with the head weights read first) in the bench,
# the one run of it the session's last device time holds.
set -u
export GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
grep -q H200 "$R/times.txt" || { log "not an H200, stopped" 0; exit 0; }
# The binaries travel as one xz archive, as in call A.
tar xJf .gpu/pack.tar.xz -C .gpu; log unpack $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 110 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
