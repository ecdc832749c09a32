#!/usr/bin/env bash
# Device call B of the ninth session of 2026-12-01, one H200, branch integ9 after call A with
# moe.down's stream form at 64 columns (call A's MoE test): the tiny harness next to the oracle,
# the bench, the skinny sweep and torch.matmul on its shapes (issue 14's decode GEMM protocol,
# now with the fused gate/up shapes), the indexer test and the equal-runs top-k test.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
( GLMC_GPU_OUT="$R/h" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 130 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 150 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
export GLMC_GPU_OUT="$R"
timeout 180 .gpu/gpu_kernels --ignored --nocapture --exact glm5_skinny_gemm_variants_are_timed >"$R/skinny.txt" 2>&1; log skinny $?
[ -f "$R/skinny.json" ] && { timeout 45 python3 scripts/torch_gemm.py "$R/skinny.json" "$R/skinny_torch.md" "$R/gemv.json" >/dev/null 2>&1; log torch-skinny $?; }
timeout 60 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
timeout 40 .gpu/gpu_kernels --ignored --nocapture --exact dsa_topk_cuts_runs_of_equal_scores_like_the_interpreter >"$R/topk-ties.txt" 2>&1; log topk-ties $?
