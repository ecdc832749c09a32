#!/usr/bin/env bash
# Device call 2 of 2026-12-01 (seventh session), one H200, branch integ (main + the prefill,
# sample, moe, topk and fuse helpers' branches): the tiny and GLM-5 harnesses next to the
# oracle (every kernel instance against the interpreter, every fixture against transformers),
# then the new kernels' own tests one at a time: the multi-block top-p sampler, the split
# dsa.topk (indexer test, equal-runs test), the persistent MoE skinny GEMM, the absorbed
# attention with the splits' variants.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
( GLMC_GPU_OUT="$R/h" timeout 240 .gpu/gpu_kernels --ignored --test-threads=3 --nocapture --exact \
    every_glm5_kernel_instance_matches_the_interpreter every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 150 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
export GLMC_GPU_OUT="$R"
t() { timeout "$1" .gpu/gpu_kernels --ignored --nocapture --exact "$2" >"$R/$3.txt" 2>&1; log "$3" $?; }
t 30 dsa_topk_cuts_runs_of_equal_scores_like_the_interpreter topk-ties
t 60 glm5_indexer_matches_and_is_timed indexer
t 90 glm5_moe_grouped_gemms_match_the_interpreter_and_are_timed moe
t 120 top_p_sampling_on_the_gpu_has_the_nucleus_distribution sampling
left=$((570 - (SECONDS - t0)))
t $left glm5_absorbed_attention_matches_and_is_timed attention
