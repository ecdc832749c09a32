#!/usr/bin/env bash
# Device call A of the fifteenth session of 2026-12-07, whose starts all found no machine; run by
# the sixteenth on an H100 (its results in callA/, tests/gpu/README.md). Built here:
# `cargo build --release --locked --bin glmc`
# on main into DIR/old/glmc; then with 2026-12-06e/callD-gate.patch applied (the stream gate)
# the same into DIR/glmc and `cargo test --release --locked -p glmc-runtime --test gpu_kernels
# --no-run`'s executable into DIR/gpu_kernels; all three stripped and packed by
# `tar cf - -C DIR . | xz -T2 -6 > .gpu/pack.tar.xz` (about 7.5 MB); the call carries `.gpu`.
#
# Runs the decode indexer test (it times the shipped ring and its three variants, two of them
# never run: by bulk copies, and asking L2 two tiles ahead), the gate's own test, main's and the gated bench on the
# same settings, Nsight Compute's launch statistics of what torch.matmul runs on q_b_proj and
# wq_b (cublas_probe.py), and on an H200 the absorbed attention and the prefill GEMM protocol,
# which have never run on one: about 150 s on an H100, 500 s on an H200.
. tests/gpu/call-preamble.sh
mkdir -p "$R/i"
GLMC_GPU_OUT="$R/i" timeout 80 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
timeout 30 .gpu/gpu_kernels --ignored --nocapture --exact a_closed_gate_holds_its_stream_until_it_opens >"$R/gate.txt" 2>&1; log gate $?
for b in old new; do
    bin=.gpu/glmc; [ $b = old ] && bin=.gpu/old/glmc
    timeout 60 $bin bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 1,8 --context 1024,32768 \
        --prefill 0 --attention sparse --json "$R/glmc-$b.json" >"$R/bench-$b.txt" 2>&1; log bench-$b $?
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
timeout 60 $NCU --clock-control none --nvtx --nvtx-include "probe/" --section LaunchStats \
    --section SpeedOfLight --section Occupancy python3 tests/gpu/results/2026-12-07/cublas_probe.py >"$R/cublas.txt" 2>&1; log cublas $?
if on_h200; then
    OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 100 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?
    OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 220 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
fi
