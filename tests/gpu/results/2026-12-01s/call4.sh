#!/usr/bin/env bash
# Device call 4 of 2026-12-01 (seventh session), one H200, the final tree (integ after the prefill
# revert, with the norm kernels' moments and dsa.topk's candidate ranking folded into shared
# includes): the tiny harness next to the oracle, then the two top-k tests.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
( GLMC_GPU_OUT="$R/h" timeout 140 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 100 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
export GLMC_GPU_OUT="$R"
timeout 25 .gpu/gpu_kernels --ignored --nocapture --exact dsa_topk_cuts_runs_of_equal_scores_like_the_interpreter >"$R/topk-ties.txt" 2>&1; log topk-ties $?
timeout 30 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
