#!/usr/bin/env bash
# Device call B of the sixteenth session of 2026-12-07. Built here as call A was
# (2026-12-07/callA.sh's header), except that the gated build carries gate.patch (this folder:
# the stream gate's flag in mapped page-locked host memory, opened by the host's store), which
# replaces 2026-12-06e/callD-gate.patch after call A found the driver refusing a wait on a flag
# from the stream-ordered pool (CUDA_ERROR_INVALID_VALUE).
#
# Runs the gate's own test, main's bench against the gated one on the same settings, and on an
# H200 the decode indexer test (its two untried rings lost on an H100 in call A; the H200 is
# the machine they were written for), the absorbed attention and the prefill GEMM protocol,
# which have never run on one: about 45 s on an H100, 400 s on an H200.
. tests/gpu/call-preamble.sh
timeout 30 .gpu/gpu_kernels --ignored --nocapture --exact a_closed_gate_holds_its_stream_until_it_opens >"$R/gate.txt" 2>&1; log gate $?
for b in old new; do
    bin=.gpu/glmc; [ $b = old ] && bin=.gpu/old/glmc
    timeout 60 $bin bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 1,8 --context 1024,32768 \
        --prefill 0 --attention sparse --json "$R/glmc-$b.json" >"$R/bench-$b.txt" 2>&1; log bench-$b $?
done
if on_h200; then
    mkdir -p "$R/i"
    GLMC_GPU_OUT="$R/i" timeout 80 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
    OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 100 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?
    OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 220 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
fi
