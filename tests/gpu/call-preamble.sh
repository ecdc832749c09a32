# The first line of a device call's script (tests/gpu/results/*/call*.sh, run by the device tool
# in the repository root with .gpu carried): sourced, it unpacks the binaries that were built
# here (.gpu/pack.tar.xz), points glmc's scripts at them, and sets up the record that comes
# back: everything under $R is tarred into $OUT/r.tgz however the script ends, and `log WHAT
# STATUS` appends each step's exit status and time to $R/times.txt, below the GPU's name and
# clocks, which `on_h200` reads.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"
mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
on_h200() { grep -q H200 "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
tar xJf .gpu/pack.tar.xz -C .gpu
log unpack $?
# What is left of the call's BUDGET seconds (default 570), which the caller sets below the device
# time left, so that the record is tarred before the call's limit.
budget=${BUDGET:-570}
left() { echo $((budget - (SECONDS - t0))); }
# `scripts/bench-gpu.sh run NAME` into $R/NAME, given what is left; skipped unless more than
# SECONDS (about what it needs) are.
bench() { # NAME SECONDS
    [ "$(left)" -gt "$2" ] || return 0
    OUT="$R/$1" BENCH_RESULTS=/nonexistent timeout "$(left)" scripts/bench-gpu.sh run "$1" >"$R/$1.txt" 2>&1
    log "$1" $?
}
# The tiny-model kernel harness beside the oracle (every kernel instance and fixture against the
# interpreter and transformers, and the CUDA-graph decode), 110 s each at most, into $R/h, $R/o.
harness_and_oracle() {
    [ "$(left)" -gt 120 ] || return 0
    mkdir -p "$R/h" "$R/o"
    ( GLMC_GPU_OUT="$R/h" timeout 110 .gpu/gpu_kernels --ignored --nocapture --exact \
        every_kernel_instance_matches_the_interpreter >"$R/harness.txt" 2>&1; log harness $? ) &
    GLMC_GPU_OUT="$R/o" timeout 110 .gpu/oracle --ignored --nocapture --test-threads=1 cuda_matches_every_fixture \
        cuda_graphs_decode >"$R/oracle.txt" 2>&1; log oracle $?
    wait
    pkill -x glmc
}
# Nsight Compute on COUNT launches of the kernels matching REGEX in one `glmc bench` decode step
# of MODEL at BATCH × CONTEXT (sparse attention), with the details page, and the source page for
# scripts/ncu_stalls.py, into $R/NAME*; skipped unless 40 s are left.
profile() { # NAME REGEX COUNT BATCH CONTEXT MODEL
    [ "$(left)" -gt 40 ] || return 0
    local ncu
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    local sections="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters"
    # shellcheck disable=SC2086
    timeout $(($(left) - 20)) "$ncu" --clock-control none -k "regex:$2" --launch-count "$3" $sections -f -o "/tmp/$1" \
        .gpu/glmc bench "$6" --device cuda --random-weights 1 --batch "$4" --context "$5" \
        --prefill 0 --attention sparse --steps 1 --warmup 0 >"$R/$1-run.txt" 2>&1
    log "$1" $?
    "$ncu" -i "/tmp/$1.ncu-rep" --page details >"$R/$1.txt" 2>&1
    "$ncu" -i "/tmp/$1.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$R/$1-sass.csv.gz"
}
