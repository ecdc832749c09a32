#!/usr/bin/env bash
# Device call C of the session of 2026-12-06: the tree that ships (call B's with the tiled GEMM's
# rope frequencies read once a column pair, not once a row and pair). The tiny harness next to
# the oracle, issue 14's prefill GEMM protocol (`scripts/bench-gpu.sh run gemm`), the bench
# (`run glmc`), the decode GEMM protocol (`run gemv`), then Nsight Compute's warp stall reasons on
# the prefill q_b_proj (rope) and the shared expert's down projection (no rope), both 256 × 128
# tiles at K = 2048, from one `glmc bench` prefill each.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o" "$R/g" "$R/b" "$R/v"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
( GLMC_GPU_OUT="$R/h" timeout 120 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 110 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/g" BENCH_RESULTS=/nonexistent timeout 190 scripts/bench-gpu.sh run gemm >"$R/gemm.txt" 2>&1; log gemm $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 120 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
OUT="$R/v" BENCH_RESULTS=/nonexistent timeout 130 scripts/bench-gpu.sh run gemv >"$R/gemv.txt" 2>&1; log gemv $?
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
M="--section SpeedOfLight --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
B=".gpu/glmc bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 1 --context 1024 --prefill 4096 --attention sparse"
prof() {
    left=$((590 - (SECONDS - t0)))
    [ $left -gt 20 ] || { log "$1 (no time)" 1; return; }
    timeout $left $NCU --clock-control none -k "regex:$2" --launch-skip 1 --launch-count 1 $M $B >"$R/ncu-$1.txt" 2>&1; log "ncu-$1" $?
}
prof q_b_proj glmc_gemm_mma_ea4ebfbd
prof shared_down glmc_gemm_mma_c1d81c6c
