#!/usr/bin/env bash
# Device call C of the thirteenth session of 2026-12-06: call B's decode indexer kernel with the
# head weights read before any copy (call B's Nsight Compute run had a sixth of the warps'
# samples waiting on them), against main at 4c5e6f7 (.gpu/old/) in the indexer test, the six
# 64-key stages as a variant; the bench; on an H200 the prefill GEMM protocol and the attention
# targets; then, while time is left, Nsight Compute on the kernel at batch 8 × 32k.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/i" "$R/io"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
# The binaries travel as one xz archive, as in call A.
tar xJf .gpu/pack.tar.xz -C .gpu; log unpack $?
GLMC_GPU_OUT="$R/i" timeout 80 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
GLMC_GPU_OUT="$R/io" timeout 60 .gpu/old/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer-old.txt" 2>&1; log indexer-old $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 100 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
if grep -q H200 "$R/times.txt"; then
    OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 200 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
    OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 90 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?
fi
if [ $((SECONDS - t0)) -lt 480 ]; then
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters"
    timeout 90 $NCU --clock-control none -k regex:dsa_score_decode --launch-count 1 $S -f -o /tmp/ncu-new \
        .gpu/glmc bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 8 --context 32768 \
        --prefill 0 --attention sparse --steps 1 --warmup 0 >"$R/ncu-new-run.txt" 2>&1; log ncu-new $?
    $NCU -i /tmp/ncu-new.ncu-rep --page details >"$R/ncu-new.txt" 2>&1
    $NCU -i /tmp/ncu-new.ncu-rep --page source --csv --print-source sass >"$R/ncu-new-sass.csv" 2>&1; log ncu-new-print $?
fi
