#!/usr/bin/env bash
# Device call A of the eighteenth session of 2026-12-07. Built here from the session's tree (the
# skinny GEMMs' and norms' weights read before the programmatic-launch wait with coherent loads;
# the read-ceiling probes; the cluster merge of the seventeenth session taken out):
# `cargo build --release --locked --bin glmc` into DIR/glmc, the executables of `cargo test
# --release --locked -p glmc-runtime --test gpu_kernels -p glmc --test oracle --no-run` into
# DIR/gpu_kernels and DIR/oracle; all stripped, packed by `tar cf - -C DIR . | xz -T2 -6 >
# .gpu/pack.tar.xz`; the call carries `.gpu`.
#
# `scripts/bench-gpu.sh run gemv` (the decode GEMM protocol with each weight's read ceiling; its
# sweep checks every variant against the interpreter) and `run glmc` (the bench), whose kernels
# the early loads changed, first; then the tiny-model kernel harness beside the oracle (every
# kernel instance and fixture against the interpreter and transformers), `run attention` and
# `run indexer`: each given only what is left of BUDGET seconds (default 570), which the caller
# sets below the device time left, so that the record is tarred before the call's limit.
. tests/gpu/call-preamble.sh
budget=${BUDGET:-570}
left() { echo $((budget - (SECONDS - t0))); }
bench() {
    [ "$(left)" -gt 30 ] || return 0
    OUT="$R/$1" BENCH_RESULTS=/nonexistent timeout "$(left)" scripts/bench-gpu.sh run "$1" >"$R/$1.txt" 2>&1
    log "$1" $?
}
bench gemv
bench glmc
if [ "$(left)" -gt 120 ]; then
    mkdir -p "$R/h" "$R/o"
    ( GLMC_GPU_OUT="$R/h" timeout 110 .gpu/gpu_kernels --ignored --nocapture --exact \
        every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
    GLMC_GPU_OUT="$R/o" timeout 110 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture \
        cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
    wait
    pkill -x glmc
fi
bench attention
bench indexer
