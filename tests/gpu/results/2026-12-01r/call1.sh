#!/usr/bin/env bash
# Device call 1 of 2026-12-01 (sixth session), one H200, branch integ (main + topk + skinny +
# prefill): the new dsa.topk (indexer test, equal-runs test), the absorbed attention with empty
# splits skipped, the skinny sweep with persistent grids against torch.matmul, and the tiled
# prefill GEMM sweep against torch.matmul. Every variant is checked against the interpreter.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
export GLMC_GPU_OUT="$R"
timeout 60 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
timeout 60 .gpu/gpu_kernels --ignored --nocapture --exact dsa_topk_cuts_runs_of_equal_scores_like_the_interpreter >"$R/topk-ties.txt" 2>&1; log ties $?
timeout 200 .gpu/gpu_kernels --ignored --nocapture --exact glm5_skinny_gemm_variants_are_timed >"$R/skinny.txt" 2>&1; log skinny $?
[ -f "$R/skinny.json" ] && { timeout 40 python3 scripts/torch_gemm.py "$R/skinny.json" "$R/skinny_torch.md" >/dev/null 2>&1; log torch-skinny $?; }
timeout 110 .gpu/gpu_kernels --ignored --nocapture --exact glm5_absorbed_attention_matches_and_is_timed >"$R/attention.txt" 2>&1; log attention $?
left=$((560 - (SECONDS - t0)))
timeout $left .gpu/gpu_kernels --ignored --nocapture --exact glm5_tiled_gemm_variants_are_timed >"$R/tiled.txt" 2>&1; log tiled $?
[ -f "$R/tiled.json" ] && { timeout 30 python3 scripts/torch_gemm.py "$R/tiled.json" "$R/tiled_torch.md" >/dev/null 2>&1; log torch-tiled $?; }
