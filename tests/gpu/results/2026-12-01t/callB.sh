#!/usr/bin/env bash
# Device call B of 2026-12-01 (eighth session), one H200, branch integ (main + the sample8,
# skinny8, b64 and score8 helpers' branches, and the MoE skinny GEMM's column/unroll variants):
# the tests that decide what ships, each alone on the GPU: the multi-block sampler's test, the
# skinny sweep and torch.matmul on its shapes, the indexer test (work-stealing shares), the
# MoE decode test (columns a block and unrolled steps).
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
export GLMC_GPU_OUT="$R"
timeout 90 .gpu/gpu_kernels --ignored --nocapture --exact top_p_sampling_on_the_gpu_has_the_nucleus_distribution >"$R/sampling.txt" 2>&1; log sampling $?
timeout 180 .gpu/gpu_kernels --ignored --nocapture --exact glm5_skinny_gemm_variants_are_timed >"$R/skinny.txt" 2>&1; log skinny $?
[ -f "$R/skinny.json" ] && { timeout 45 python3 scripts/torch_gemm.py "$R/skinny.json" "$R/skinny_torch.md" "$R/gemv.json" >/dev/null 2>&1; log torch-skinny $?; }
timeout 140 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
timeout 100 .gpu/gpu_kernels --ignored --nocapture --exact glm5_moe_grouped_gemms_match_the_interpreter_and_are_timed >"$R/moe.txt" 2>&1; log moe $?
