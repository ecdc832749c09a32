#!/usr/bin/env bash
# Device call D of the second session of 2026-12-06: back to the 8-warp wide kernel of call A
# (16 warps lost in call C), now on the shared ring functions of mla_keys.cuh. The
# absorbed-attention test, then the GLM-5 harness until its time runs out (the attention's
# instances come early).
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h5" "$R/a"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
GLMC_GPU_OUT="$R/a" timeout 110 .gpu/gpu_kernels --ignored --nocapture --exact \
    glm5_absorbed_attention_matches_and_is_timed >"$R/attention.txt" 2>&1; log attention $?
GLMC_GPU_OUT="$R/h5" timeout 50 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_glm5_kernel_instance_matches_the_interpreter >"$R/harness-glm5.txt" 2>&1; log harness-glm5 $?
