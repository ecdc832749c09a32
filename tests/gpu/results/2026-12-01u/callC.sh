#!/usr/bin/env bash
# Device call C of the ninth session of 2026-12-01, one H200, integ9 as in call B: the MoE
# decode test at 64 tokens (every moe.down form, each checked against the interpreter).
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
GLMC_GPU_OUT="$R" timeout 420 .gpu/gpu_kernels --ignored --nocapture --exact glm5_moe_grouped_gemms_at_64_tokens_match_the_interpreter_and_are_timed >"$R/moe64.txt" 2>&1; log moe64 $?
