#!/usr/bin/env bash
# Device call D of the sixteenth session of 2026-12-07. Built here from the session's tree, whose
# absorbed attention now splits a row only as far as its blocks fit one wave of the GPU
# (codegen's mla_split_tiers: GLM-5's 64 heads at batch 64 unsplit, no merge), into .gpu/glmc
# and .gpu/gpu_kernels, with main's glmc (a00c5f5) in .gpu/old/; all stripped, packed as
# .gpu/pack.tar.xz; the call carries `.gpu`.
#
# Runs `scripts/bench-gpu.sh run attention` (the new splits checked against the interpreter and
# timed, fewer splits beside them), then on an H200 `run indexer` and `run glmc` (the bench whose
# results bench/RESULTS.md shows), elsewhere main's bench against this one on the decode points
# the splits change: about 250 s on an H100, 420 s on an H200.
. tests/gpu/call-preamble.sh
OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 170 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?
if on_h200; then
    OUT="$R/x" BENCH_RESULTS=/nonexistent timeout 60 scripts/bench-gpu.sh run indexer >"$R/indexer.txt" 2>&1; log indexer $?
    OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 300 scripts/bench-gpu.sh run glmc >"$R/glmc.txt" 2>&1; log glmc $?
else
    for b in old new; do
        bin=.gpu/glmc; [ $b = old ] && bin=.gpu/old/glmc
        timeout 100 $bin bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 1,8,64 \
            --context 1024,32768 --prefill 0 --attention sparse,dense --json "$R/glmc-$b.json" >"$R/bench-$b.txt" 2>&1
        log bench-$b $?
    done
fi
