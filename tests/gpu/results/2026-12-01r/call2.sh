#!/usr/bin/env bash
# Device call 2 of 2026-12-01 (sixth session), one H200, branch integ with the sweeps' winners
# shipped: the GLM-5 and tiny harnesses next to the oracle (every kernel instance against the
# interpreter, every fixture against transformers), then the benchmark (decode and prefill).
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
( GLMC_GPU_OUT="$R/h" timeout 230 .gpu/gpu_kernels --ignored --test-threads=3 --nocapture --exact \
    every_glm5_kernel_instance_matches_the_interpreter every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 120 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
export GLMC_GPU_OUT="$R"
left=$((540 - (SECONDS - t0)))
OUT="$R/b" timeout $left scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
