#!/usr/bin/env bash
# Device call 3 of 2026-12-01 (fourth session), one H200: the merged main's checks, bench, the torch.compile peers.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/single" "$R/harness"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
( GLMC_GPU_OUT="$R/harness" timeout 230 .gpu/gpu_kernels --ignored --test-threads=3 --nocapture \
    --skip timed --skip bandwidth --skip random_weights --skip top_p >"$R/harness.txt" 2>&1; log harness $? ) &
export GLMC_GPU_OUT="$R/single"
timeout 80 .gpu/glm5_gpu --ignored --nocapture --exact glm5_2layer_on_the_gpu_matches_the_interpreter >"$R/glm5-2layer.txt" 2>&1; log glm5-2layer $?
timeout 140 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/b1" timeout 100 scripts/bench-gpu.sh run glmc >"$R/bench-glmc.txt" 2>&1; log bench-glmc $?
pkill -x glmc
OUT="$R/b2" scripts/bench-gpu.sh run peers reduce-overhead 100 >"$R/peers-ro.txt" 2>&1; log peers-reduce-overhead $?
left=$((555 - (SECONDS - t0)))
OUT="$R/b3" scripts/bench-gpu.sh run peers max-autotune-no-cudagraphs $left >"$R/peers-ma.txt" 2>&1; log peers-max-autotune $?
