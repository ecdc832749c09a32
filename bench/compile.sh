#!/usr/bin/env bash
# Times `glmc compile models/glm5.ron --target sm120` (release build) without a CUDA compiler,
# with the pinned nvcc and a warm cubin cache, and with a cold one; and the reference interpreter
# on a committed tiny checkpoint. Prints one markdown table row each.
# The goal (issue "The IR, the GLM-5 graph, ..."): compile under 2 s without nvcc.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
time_runs() { # label, runs, command...
  local label=$1 runs=$2; shift 2
  local times=()
  for _ in $(seq "$runs"); do
    local start end
    start=$(date +%s.%N); "$@" >/dev/null 2>&1; end=$(date +%s.%N)
    times+=("$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')")
  done
  printf '%s\n' "${times[@]}" | sort -n | awk -v label="$label" -v n="$runs" \
    '{ t[NR] = $1 } END { printf "| %s | %d | %.3f s | %.3f s | %.3f s |\n", label, n, t[1], t[int((n + 1) / 2)], t[n] }'
}
echo "| what | runs | min | median | max |"
echo "|---|---|---|---|---|"
nvcc=$(scripts/cuda-toolchain.sh)
time_runs "glmc compile models/glm5.ron --target sm120 (no CUDA compiler)" 10 \
  env -u GLMC_NVCC PATH=/usr/bin:/bin ./target/release/glmc compile models/glm5.ron --target sm120 -o "$out/glm5"
GLMC_NVCC=$nvcc GLMC_CACHE_DIR="$out/cache" ./target/release/glmc compile models/glm5.ron --target sm120 -o "$out/glm5" >/dev/null 2>&1
time_runs "glmc compile models/glm5.ron --target sm120 (nvcc, cubin cached)" 10 \
  env GLMC_NVCC="$nvcc" GLMC_CACHE_DIR="$out/cache" ./target/release/glmc compile models/glm5.ron --target sm120 -o "$out/glm5"
cold() { rm -rf "$out/cold"; GLMC_NVCC="$nvcc" GLMC_CACHE_DIR="$out/cold" ./target/release/glmc compile models/glm5.ron --target sm120 -o "$out/glm5"; }
time_runs "glmc compile models/glm5.ron --target sm120 (nvcc, cold cache)" 3 cold
time_runs "glmc run tests/oracle/fixtures/sparse (20-token prompt, 6 new)" 10 \
  ./target/release/glmc run tests/oracle/fixtures/sparse --prompt-ids 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19 --max-new-tokens 6
