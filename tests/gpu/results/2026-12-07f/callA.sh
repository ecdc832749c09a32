#!/usr/bin/env bash
# Device call A of the eighteenth session of 2026-12-07. Built here from the session's tree (the
# skinny GEMMs' and norms' weights read before the programmatic-launch wait with coherent loads;
# the read-ceiling probes; the cluster merge of the seventeenth session taken out):
# `cargo build --release --locked --bin glmc` into DIR/glmc, the executables of `cargo test
# --release --locked -p glmc-runtime --test gpu_kernels -p glmc --test oracle --no-run` into
# DIR/gpu_kernels and DIR/oracle; all stripped, packed by `tar cf - -C DIR . | xz -T2 -6 >
# .gpu/pack.tar.xz`; the call carries `.gpu`.
#
# Runs the tiny-model kernel harness and the oracle (every kernel instance and fixture against
# the interpreter and transformers), then `scripts/bench-gpu.sh run gemv` (the decode GEMM
# protocol with each weight's read ceiling), `run glmc` (the bench), `run attention` and
# `run indexer`, each given only the time left of 570 s: bench/RESULTS.md's runs, where the
# machine is an H200.
. tests/gpu/call-preamble.sh
mkdir -p "$R/h" "$R/o"
( GLMC_GPU_OUT="$R/h" timeout 110 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 110 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture \
    cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
for what in gemv glmc attention indexer; do
    left=$((570 - (SECONDS - t0)))
    [ $left -gt 30 ] || break
    OUT="$R/$what" BENCH_RESULTS=/nonexistent timeout $left scripts/bench-gpu.sh run "$what" >"$R/$what.txt" 2>&1
    log "$what" $?
done
