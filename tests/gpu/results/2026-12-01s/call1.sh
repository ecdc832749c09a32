#!/usr/bin/env bash
# Device call 1 of 2026-12-01 (seventh session), one H200, main at 89cc62f: the norms' weights
# loaded before the wait, moe.combine's loads issued together, the deep narrow skinny tile for
# the shared expert. The oracle (every fixture end to end, CUDA graphs), the skinny sweep, the
# MoE GEMM test (moe.combine's instance is checked by the harness in a later call), the bench.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
GLMC_GPU_OUT="$R/o" timeout 120 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
export GLMC_GPU_OUT="$R"
timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact glm5_skinny_gemm_variants_are_timed >"$R/skinny.txt" 2>&1; log skinny $?
OUT="$R/b" timeout 150 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
