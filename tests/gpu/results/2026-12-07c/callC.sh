#!/usr/bin/env bash
# Device call C of the sixteenth session of 2026-12-07. Built here from the session's tree (the
# bulk-copy and L2-ahead indexer rings taken out, the indexer test writing indexer.json, the
# attention test timing fewer splits at batch 64): `cargo build --release --locked --bin glmc`
# and `cargo test --release --locked -p glmc-runtime --test gpu_kernels --no-run`'s executable,
# stripped, packed as .gpu/pack.tar.xz; the call carries `.gpu`.
#
# Runs `scripts/bench-gpu.sh run indexer` (issue 14's indexer-scoring target from its GPU test)
# and `run attention` (the absorbed attention, with one split and in one wave at batch 64 beside
# the shipped splits), and on an H200 `run glmc` (the bench, its kernels renamed by the rings'
# removal): about 150 s on an H100, 420 s on an H200.
. tests/gpu/call-preamble.sh
OUT="$R/x" BENCH_RESULTS=/nonexistent timeout 60 scripts/bench-gpu.sh run indexer >"$R/indexer.txt" 2>&1; log indexer $?
OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 170 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?
if on_h200; then
    OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 290 scripts/bench-gpu.sh run glmc >"$R/glmc.txt" 2>&1; log glmc $?
fi
