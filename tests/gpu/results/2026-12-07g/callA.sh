#!/usr/bin/env bash
# Device call A of the nineteenth session of 2026-12-07, whose seventeen tries found no machine,
# and of the twentieth, whose ten found none either (tests/gpu/README.md). Built here from the
# tree of the session that runs it: main's kernels (the skinny GEMMs' and norms' weights read
# before the programmatic-launch wait, which has run only on an H100) and the attention variants
# the attention test times beside the shipped kernels, each checked against the interpreter (the
# few-heads kernel `mla_absorbed_few.cu` at every 8-head case; the wide kernel's keys-as-rows
# scores and deep ring wherever it runs): `cargo build --release --locked --bin glmc` into
# DIR/glmc, the executables of `cargo test --release --locked -p glmc-runtime --test gpu_kernels
# -p glmc --test oracle --no-run` into DIR/gpu_kernels and DIR/oracle; all stripped, packed by
# `tar cf - -C DIR . | xz -T2 -6 > .gpu/pack.tar.xz`; the call carries `.gpu`.
#
# On an H200 (where issue 14's targets are judged): `scripts/bench-gpu.sh run attention` (the
# variants against the shipped kernels), `run gemv` and `run glmc`, the tiny-model kernel harness
# beside the oracle and `run indexer`, each given what is left of BUDGET seconds (default 570).
# On an H100, whose numbers for main are already recorded (2026-12-07f): `run attention`, then
# Nsight Compute for the kernel work: the shipped absorbed attention at 64 heads (the wide kernel,
# batch 64 × 32k; the twentieth session put it here in place of the 8-head one, whose few-heads
# successor the attention test times) and the skinny GEMMs of one layer at batch 8, with their
# source pages for scripts/ncu_stalls.py.
. tests/gpu/call-preamble.sh
if on_h200; then
    bench attention 30
    bench gemv 120
    bench glmc 50
    harness_and_oracle
    bench indexer 20
else
    bench attention 30
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters"
    profile() { # NAME REGEX COUNT BATCH CONTEXT MODEL
        [ "$(left)" -gt 40 ] || return 0
        timeout $(($(left) - 20)) $NCU --clock-control none -k "regex:$2" --launch-count "$3" $S -f -o "/tmp/$1" \
            .gpu/glmc bench "$6" --device cuda --random-weights 1 --batch "$4" --context "$5" \
            --prefill 0 --attention sparse --steps 1 --warmup 0 >"$R/$1-run.txt" 2>&1; log "$1" $?
        $NCU -i "/tmp/$1.ncu-rep" --page details >"$R/$1.txt" 2>&1
        $NCU -i "/tmp/$1.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$R/$1-sass.csv.gz"
    }
    profile wide64 glmc_mla_absorbed_wide 1 64 32768 models/glm5-slice.ron
    profile skinny glmc_gemm_skinny 12 8 1024 models/glm5-slice.ron
fi
