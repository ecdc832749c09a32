#!/usr/bin/env bash
# Device call 2 of 2026-12-01 (fourth session): main's MoE 4096 check, glm5_2layer, bench; the perf branch's checks and bench.
# Carried: .gpu (main at 5b5b432: glmc, gpu_kernels, glm5_gpu) and .gpu-perf (the branch decode-gemv-perf: glmc, gpu_kernels).
set -u
export GLMC_REPO="$PWD" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/main" "$R/perf"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
# perf branch correctness (untimed) beside main's MoE prefill check
( GLMC_BIN="$PWD/.gpu-perf/glmc" GLMC_GPU_OUT="$R/perf" timeout 280 .gpu-perf/gpu_kernels --ignored --test-threads=3 --nocapture \
    --skip timed --skip bandwidth --skip random_weights --skip top_p >"$R/perf-checks.txt" 2>&1; log perf-checks $? ) &
GLMC_BIN="$PWD/.gpu/glmc" GLMC_GPU_OUT="$R/main" timeout 290 .gpu/gpu_kernels --ignored --nocapture --exact \
    glm5_moe_grouped_gemms_at_prefill_match_the_interpreter_and_are_timed >"$R/moe-prefill.txt" 2>&1; log moe-prefill $?
wait
pkill -x glmc
GLMC_BIN="$PWD/.gpu/glmc" GLMC_GPU_OUT="$R/main" timeout 70 .gpu/glm5_gpu --ignored --nocapture --exact \
    glm5_2layer_on_the_gpu_matches_the_interpreter >"$R/glm5-2layer.txt" 2>&1; log glm5-2layer $?
pkill -x glmc
for v in main perf; do
  b=.gpu/glmc; [ $v = perf ] && b=.gpu-perf/glmc
  left=$((565 - (SECONDS - t0))); [ $left -lt 20 ] && break
  timeout $left $b bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 1,8,64 \
    --context 1024,8192,32768 --prefill 4096 --attention sparse,dense --json "$R/$v/glmc.json" >"$R/$v/bench.txt" 2>&1
  log bench-$v $?
done
