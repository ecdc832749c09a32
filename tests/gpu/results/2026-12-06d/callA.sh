#!/usr/bin/env bash
# Device call A of the thirteenth session of 2026-12-06: the decode indexer kernel with lean copies
# (each thread's copy offsets fixed, the tile cursor walked instead of divided, a row's position
# read once) against the kernel before it (main at 4c5e6f7, .gpu/old/) in the
# indexer test, with a ring of six 64-key tiles as a variant; Nsight Compute on both at batch
# 8 × 32k (stall reasons and per-instruction samples); the tiny harness next to the oracle; the
# bench; then, on an H200 and while time is left, the prefill GEMM protocol and the attention
# targets.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o" "$R/i" "$R/io"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
# The binaries travel as one xz archive (both builds' raw binaries are over the 64 MiB a call
# carries).
tar xJf .gpu/pack.tar.xz -C .gpu; log unpack $?
GLMC_GPU_OUT="$R/i" timeout 80 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
GLMC_GPU_OUT="$R/io" timeout 60 ./.gpu/old/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer-old.txt" 2>&1; log indexer-old $?
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters"
for v in new old; do
    bin=.gpu/glmc; [ $v = old ] && bin=.gpu/old/glmc
    timeout 90 $NCU --clock-control none -k regex:dsa_score_decode --launch-count 1 $S -f -o /tmp/ncu-$v \
        $bin bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 8 --context 32768 \
        --prefill 0 --attention sparse --steps 1 --warmup 0 >"$R/ncu-$v-run.txt" 2>&1; log ncu-$v $?
    $NCU -i /tmp/ncu-$v.ncu-rep --page details >"$R/ncu-$v.txt" 2>&1
    $NCU -i /tmp/ncu-$v.ncu-rep --page raw --csv >"$R/ncu-$v-raw.csv" 2>&1
    $NCU -i /tmp/ncu-$v.ncu-rep --page source --csv --print-source sass >"$R/ncu-$v-sass.csv" 2>&1; log ncu-$v-print $?
done
( GLMC_GPU_OUT="$R/h" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 130 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 100 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
if grep -q H200 "$R/times.txt"; then
    [ $((SECONDS - t0)) -lt 340 ] && { OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 200 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?; }
    [ $((SECONDS - t0)) -lt 490 ] && { OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 90 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?; }
fi
