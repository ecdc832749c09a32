#!/usr/bin/env bash
# Device call A of the twenty-second session of 2026-12-08, for the device time that sixteen
# refused tries of results/2026-12-07i/callB.sh and one of this script left: the attention
# test on the case that judges issue 14's 64-head target (64 heads × 64 rows × 32768), with its
# variants (fewer splits, 16 heads a block, the bulk-copy ring, 64 heads a block), checked
# against the interpreter. Pack: `cargo build --release --locked --bin glmc` into DIR/glmc and
# the executables of `cargo test --release --locked -p glmc-runtime --test gpu_kernels -p glmc
# --test oracle --no-run` into DIR/gpu_kernels and DIR/oracle, stripped, `tar cf - -C DIR . | xz
# -T2 -6 > .gpu/pack.tar.xz`; the call carries `.gpu`.
. tests/gpu/call-preamble.sh
mkdir -p "$R/attention"
GLMC_ATTENTION_CASES=64x64x32768 GLMC_GPU_OUT="$R/attention" timeout $(($(left) - 10)) \
    .gpu/gpu_kernels --ignored --nocapture --exact glm5_absorbed_attention_matches_and_is_timed \
    >"$R/attention.txt" 2>&1
log attention $?
