#!/usr/bin/env bash
# Device call A of 2026-12-01 (eighth session), one H200, main with the harness's add.rmsnorm
# reference taken from the stored sum: the tiny harness, then the two top-k tests (the keys fold
# of c3df292 had only been compile-checked).
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
GLMC_GPU_OUT="$R/h" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $?
export GLMC_GPU_OUT="$R"
timeout 25 .gpu/gpu_kernels --ignored --nocapture --exact dsa_topk_cuts_runs_of_equal_scores_like_the_interpreter >"$R/topk-ties.txt" 2>&1; log topk-ties $?
timeout 30 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
