#!/usr/bin/env bash
# Device call B of the twenty-first session of 2026-12-07. Call A (results/2026-12-07g/callA.sh,
# its record in callA/) ran on an H100: the few-heads kernel, the keys-as-rows scores and the deep
# ring did not beat the shipped kernels, and Nsight Compute found the wide kernel's first score
# MMA of a tile held on the long scoreboard behind the ring's 9 cp.async a thread. This call
# times the ring filled by bulk copies instead (`Variant::Mla(MlaKernel::BulkCopy)`, both
# kernels that have the two-stage ring) beside the shipped kernels in the attention test, each
# checked against the interpreter, and, from the twenty-second session's pack on, the 64-head
# kernel (`Variant::Mla(MlaKernel::Wide64)`, mla_absorbed_wide64.cu) wherever the wide kernel
# runs 64 heads. Pack, built here from the tree of the session that runs it
# (the call that was refused carried one built before the losing variants were removed):
# `cargo build --release --locked --bin glmc` into
# DIR/glmc and the executables of `cargo test --release --locked -p glmc-runtime --test
# gpu_kernels -p glmc --test oracle --no-run` into DIR/gpu_kernels and DIR/oracle, stripped,
# `tar cf - -C DIR . | xz -T2 -6 > .gpu/pack.tar.xz`; the call carries `.gpu`.
#
# The attention test runs outside bench-gpu.sh under its own limit: a ring whose mbarrier never
# completed would hang it, and the lines it printed say where. On an H200, where BUDGET leaves
# room, the rest goes to `run gemv` and `run glmc` (the decode GEMMs' early weight loads, never
# run on an H200).
. tests/gpu/call-preamble.sh
mkdir -p "$R/attention"
reserve=20
nvidia-smi -L | grep -q H200 && [ "$(left)" -gt 330 ] && reserve=150
GLMC_GPU_OUT="$R/attention" timeout $(($(left) - reserve)) .gpu/gpu_kernels --ignored --nocapture \
    --exact glm5_absorbed_attention_matches_and_is_timed >"$R/attention.txt" 2>&1
log attention $?
if on_h200; then
    bench gemv 100
    bench glmc 50
fi
