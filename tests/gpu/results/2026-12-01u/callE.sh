#!/usr/bin/env bash
# Device call E of the ninth session of 2026-12-01, one H200, main after the review's folds
# (moe_down_stream.cu reads its rows of h with ld_vec; the torch scripts share run_header): the
# MoE decode test, the tiny harness, and torch_gemm.py on call B's skinny.json.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/m"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
GLMC_GPU_OUT="$R/m" timeout 100 .gpu/gpu_kernels --ignored --nocapture --exact glm5_moe_grouped_gemms_match_the_interpreter_and_are_timed >"$R/moe.txt" 2>&1; log moe $?
GLMC_GPU_OUT="$R/h" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $?
timeout 60 python3 scripts/torch_gemm.py tests/gpu/results/2026-12-01u/callB/skinny.json "$R/skinny_torch.md" "$R/gemv.json" >"$R/torch.txt" 2>&1; log torch-gemm $?
