#!/usr/bin/env bash
# Device call C of the seventeenth session of 2026-12-07, the one call of the session that ran
# (calls A and B, which held more, never found a machine). Built here from the session's tree
# (the absorbed attention's splits merged inside their thread-block cluster, up to 8; the skinny
# GEMMs' and norms' weights read before the programmatic-launch wait with coherent loads, which
# ptxas leaves there; the read-ceiling probes): `cargo build --release --locked --bin glmc` into
# DIR/glmc, the executables of `cargo test --release --locked -p glmc-runtime --test gpu_kernels
# -p glmc --test oracle --no-run` into DIR/gpu_kernels and DIR/oracle; all stripped, packed by
# `tar cf - -C DIR . | xz -T2 -6 > .gpu/pack.tar.xz`; the call carries `.gpu`.
#
# What the 614 s of device time left after eighteen failed starts hold: the tiny and GLM-5
# kernel harnesses and the oracle (the cluster merge and the early loads checked), then
# `scripts/bench-gpu.sh run attention` and `run gemv`, each given only the time left of 440 s.
. tests/gpu/call-preamble.sh
mkdir -p "$R/h" "$R/h5" "$R/o"
( GLMC_GPU_OUT="$R/h" timeout 110 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
( GLMC_GPU_OUT="$R/h5" timeout 100 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_glm5_kernel_instance_matches_the_interpreter >"$R/harness-glm5.txt" 2>&1; log harness-glm5 $? ) &
GLMC_GPU_OUT="$R/o" timeout 110 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture \
    cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
for what in attention gemv; do
    left=$((440 - (SECONDS - t0)))
    [ $left -gt 30 ] || break
    OUT="$R/$what" BENCH_RESULTS=/nonexistent timeout $left scripts/bench-gpu.sh run "$what" >"$R/$what.txt" 2>&1
    log "$what" $?
done
