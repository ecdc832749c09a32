#!/usr/bin/env bash
# Device call 3 of 2026-12-01 (seventh session), one H200, branch integ after call 2 (the
# prefill, topk and fuse helpers' branches; the moe and sample branches reverted; two key tiles
# a split in the sparse attention): the tiny and GLM-5 harnesses next to the oracle, the tiled
# prefill GEMM sweep against torch.matmul, then the benchmark.
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
OUT="$R/b" timeout 150 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
left=$((560 - (SECONDS - t0)))
timeout $left .gpu/gpu_kernels --ignored --nocapture --exact glm5_tiled_gemm_variants_are_timed >"$R/tiled.txt" 2>&1; log tiled $?
[ -f "$R/tiled.json" ] && { timeout 30 python3 scripts/torch_gemm.py "$R/tiled.json" "$R/tiled_torch.md" >/dev/null 2>&1; log torch-tiled $?; }
