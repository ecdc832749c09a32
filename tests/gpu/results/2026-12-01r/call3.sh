#!/usr/bin/env bash
# Device call 3 of 2026-12-01 (sixth session), one H200: after the review (the sweeps pick their
# launches through one distinct_launches), both GEMM sweeps again.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
export GLMC_GPU_OUT="$R"
timeout 200 .gpu/gpu_kernels --ignored --nocapture --exact glm5_skinny_gemm_variants_are_timed >"$R/skinny.txt" 2>&1; log skinny $?
timeout 300 .gpu/gpu_kernels --ignored --nocapture --exact glm5_tiled_gemm_variants_are_timed >"$R/tiled.txt" 2>&1; log tiled $?
