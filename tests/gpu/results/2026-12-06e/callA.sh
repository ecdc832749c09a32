#!/usr/bin/env bash
# Device call A of the fourteenth session of 2026-12-06: main at 87d5b8c, measured where only an
# H100 had measured it: the decode indexer test (the shipped three 128-key stages and the six
# 64-key stages) and Nsight Compute on the indexer at batch 8 × 32k; on an H200 also the prefill
# GEMM protocol and the absorbed-attention targets.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/i"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
tar xJf .gpu/pack.tar.xz -C .gpu; log unpack $?
GLMC_GPU_OUT="$R/i" timeout 80 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters"
timeout 90 $NCU --clock-control none -k regex:dsa_score_decode --launch-count 1 $S -f -o /tmp/ncu-new \
    .gpu/glmc bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 8 --context 32768 \
    --prefill 0 --attention sparse --steps 1 --warmup 0 >"$R/ncu-run.txt" 2>&1; log ncu $?
$NCU -i /tmp/ncu-new.ncu-rep --page details >"$R/ncu.txt" 2>&1
$NCU -i /tmp/ncu-new.ncu-rep --page source --csv --print-source sass >"$R/ncu-sass.csv" 2>&1; log ncu-print $?
gzip -9 "$R/ncu-sass.csv"
if grep -q H200 "$R/times.txt"; then
    OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 100 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?
    OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 220 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
fi
