#!/usr/bin/env bash
# Device call A of 2026-12-01 (fifth session), one H200: the skinny GEMM's variants, the decode bench, the tiny-model harness.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
export GLMC_GPU_OUT="$R"
timeout 260 .gpu/gpu_kernels --ignored --nocapture --exact glm5_skinny_gemm_variants_are_timed >"$R/skinny.txt" 2>&1; log skinny $?
[ -f "$R/skinny.json" ] && { python3 scripts/torch_gemm.py "$R/skinny.json" "$R/skinny_torch.md" >/dev/null 2>&1; log torch $?; }
pkill -x glmc
OUT="$R/b" timeout 110 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
pkill -x glmc
left=$((560 - (SECONDS - t0)))
timeout $left .gpu/gpu_kernels --ignored --nocapture --test-threads=3 --exact every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $?
