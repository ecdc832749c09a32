#!/usr/bin/env bash
# Device call B of the fourteenth session of 2026-12-06: the persistent skinny GEMM whose ring
# stays full across tiles (gemm_skinny_persistent.cu; q_b_proj ships it) against main at 87d5b8c
# (.gpu/old/) in the skinny sweep, both in one call (the new sweep also times 32 columns a warp
# on q_b_proj's persistent grid); the tiny harness next to the oracle; the
# bench; the indexer test (its graph-timed kernel next to the bench's per-launch time); on an
# H200 also the absorbed-attention targets.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R/h" "$R/o" "$R/i" "$R/vo"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
# The binaries travel as one xz archive (both builds' raw binaries pass 64 MiB).
tar xJf .gpu/pack.tar.xz -C .gpu; log unpack $?
( GLMC_GPU_OUT="$R/h" timeout 150 .gpu/gpu_kernels --ignored --nocapture --exact \
    every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
GLMC_GPU_OUT="$R/o" timeout 130 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
wait
pkill -x glmc
OUT="$R/v" BENCH_RESULTS=/nonexistent timeout 200 scripts/bench-gpu.sh run gemv >"$R/gemv.txt" 2>&1; log gemv $?
GLMC_BIN="$PWD/.gpu/old/glmc" GLMC_GPU_OUT="$R/vo" timeout 160 .gpu/old/gpu_kernels --ignored --nocapture --exact \
    glm5_skinny_gemm_variants_are_timed >"$R/gemv-old.txt" 2>&1; log gemv-old $?
OUT="$R/b" BENCH_RESULTS=/nonexistent timeout 100 scripts/bench-gpu.sh run glmc >"$R/bench.txt" 2>&1; log bench $?
GLMC_GPU_OUT="$R/i" timeout 60 .gpu/gpu_kernels --ignored --nocapture --exact glm5_indexer_matches_and_is_timed >"$R/indexer.txt" 2>&1; log indexer $?
if grep -q H200 "$R/times.txt" && [ $((SECONDS - t0)) -lt 450 ]; then
    OUT="$R/a" BENCH_RESULTS=/nonexistent timeout 100 scripts/bench-gpu.sh run attention >"$R/attention.txt" 2>&1; log attention $?
fi
