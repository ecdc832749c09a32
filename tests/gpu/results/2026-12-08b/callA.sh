#!/usr/bin/env bash
# Device call A of the twenty-third session of 2026-12-08 (the host lent no machine that session,
# so a later session runs it). Pack, built here from the tree of the session that runs it:
# `cargo build --release --locked --bin glmc` into DIR/glmc and the executables of `cargo test
# --release --locked -p glmc-runtime --test gpu_kernels -p glmc --test oracle --no-run` into
# DIR/gpu_kernels and DIR/oracle, stripped, `tar cf - -C DIR . | xz -T2 -6 > .gpu/pack.tar.xz`;
# the call carries `.gpu`. Run with BUDGET set below the device time left.
#
# 1. `run gemv`: the decode GEMM protocol's sweep, where each 16-row skinny GEMM whose K allows
#    it is also timed with its rows of x staged in shared memory (`with_x_staged`), beside the
#    shipped kernels, whose early weight loads have never run on an H200.
# 2. On an H200, `run glmc`: the bench whose decode steps the batch-1 targets are judged on.
# 3. The attention test, under its own limit (a bulk-copy ring whose mbarrier never completed
#    would hang it; the lines it printed say where): the shipped kernels beside the bulk-copy
#    ring and the 64-head kernel, each checked against the interpreter, and on an H200 the
#    gather ceiling the 8-head target has never been measured against there.
# 4. On an H200, with what is left, Nsight Compute on the shipped 8-head attention (an 8-head
#    slice of glm5-slice.ron at batch 64 × 32k): the stall reasons and DRAM throughput behind its
#    64.9% of the copy bandwidth there, which no profile has looked at on an H200.
. tests/gpu/call-preamble.sh
bench gemv 100
if on_h200; then
    bench glmc 50
fi
mkdir -p "$R/attention"
reserve=10
on_h200 && reserve=70
GLMC_GPU_OUT="$R/attention" timeout $(($(left) - reserve)) .gpu/gpu_kernels --ignored --nocapture \
    --exact glm5_absorbed_attention_matches_and_is_timed >"$R/attention.txt" 2>&1
log attention $?
if on_h200; then
    sed 's/num_attention_heads: 64/num_attention_heads: 8/' models/glm5-slice.ron >/tmp/slice8.ron
    profile attn8 glmc_mla_absorbed 1 64 32768 /tmp/slice8.ron
fi
