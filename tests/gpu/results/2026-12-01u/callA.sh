#!/usr/bin/env bash
# Device call A of the ninth session of 2026-12-01, one H200, branch integ9 (main + fold9:
# head-weight scale and router cast folded; mlp9: gate/up one GEMM; down9: moe.down stream form;
# lead9: dsa.topk's narrowing once): the tiny and GLM-5 harnesses next to the oracle and the
# check-finite trace test, then the bench, then the MoE decode test.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o" "$R/m"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
( GLMC_GPU_OUT="$R/h" timeout 280 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter every_glm5_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 130 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
GLMC_GPU_OUT="$R/o" timeout 60 .gpu/trace --ignored --nocapture --exact check_finite_names_the_first_non_finite_node_on_the_gpu >"$R/trace.txt" 2>&1; log trace $?
wait
pkill -x glmc
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 170 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
GLMC_GPU_OUT="$R/m" timeout 100 .gpu/gpu_kernels --ignored --nocapture --exact glm5_moe_grouped_gemms_match_the_interpreter_and_are_timed >"$R/moe.txt" 2>&1; log moe $?
