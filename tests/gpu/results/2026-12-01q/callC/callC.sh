#!/usr/bin/env bash
# Device call C of 2026-12-01 (fifth session), one H200: perf after call B (weights before the PDL wait, the
# indexer's one-row guard, the skinny tiles): correctness, the skinny sweep against torch.matmul, the indexer, the bench.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
( GLMC_GPU_OUT="$R/h" timeout 250 .gpu/gpu_kernels --ignored --test-threads=3 --nocapture \
    every_kernel_instance_matches_the_interpreter every_glm5_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 150 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
export GLMC_GPU_OUT="$R"
timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact glm5_skinny_gemm_variants_are_timed >"$R/skinny.txt" 2>&1; log skinny $?
[ -f "$R/skinny.json" ] && { python3 scripts/torch_gemm.py "$R/skinny.json" "$R/skinny_torch.md" >/dev/null 2>&1; log torch $?; }
timeout 40 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
pkill -x glmc
left=$((560 - (SECONDS - t0)))
OUT="$R/b" timeout $left scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
