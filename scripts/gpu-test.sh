#!/usr/bin/env bash
# The GPU tests, in two halves around one device call.
#
#   scripts/gpu-test.sh build [glmc]  # here: builds the GPU test binaries (release, no debug
#                               # info; with `glmc`, only the glmc binary)
#                               # into .gpu/ (git-ignored), small enough to carry (< 64 MiB)
#   scripts/gpu-test.sh run [ARGS]    # on the GPU machine, from the repository root: runs them
#                               # all; ARGS go to every test binary (a name filter, or
#                               # `--skip NAME` to leave the timing runs out when device time is short)
#   scripts/gpu-test.sh run-tp [ARGS] # on a machine with two GPUs (nvidia-h200-x2): the
#                               # tensor-parallel tests (tp_gpu: NCCL --tp 2 against --tp 1,
#                               # faults, decode speed), their report in tp.md
#
# The device call carries `.gpu` and runs `scripts/gpu-test.sh run`; results land in
# $OUT/results.tgz (one log per group, times.txt, and the reports the tests write: harness.txt,
# indexer.md, gemm.md, ...) and are recorded in tests/gpu/README.md.
# The oracle's, the traces' and the GLM-5-sized GPU tests run the `glmc` binary carried in .gpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
build)
    mkdir -p .gpu
    exclude="$(git rev-parse --git-common-dir)/info/exclude"
    grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
    cargo build --release --locked --bin glmc
    cp target/release/glmc .gpu/glmc
    # `build glmc` (what scripts/bench-gpu.sh needs) stops here.
    if [ "${2:-}" = glmc ]; then
        ls -la .gpu
        exit 0
    fi
    # The test binaries with GPU tests, by name: the kernel harness, the oracle, the
    # cross-device traces, the GLM-5-sized runs and tensor parallelism on two GPUs.
    cargo test --release --locked -p glmc-runtime --test gpu_kernels -p glmc --test oracle --test trace --test glm5_gpu --test tp_gpu \
        --no-run --message-format=json |
        python3 -c 'import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("gpu_kernels", "oracle", "trace", "glm5_gpu", "tp_gpu"):
        shutil.copy(m["executable"], ".gpu/" + m["target"]["name"])'
    ls -la .gpu
    ;;
run | run-tp)
    mode=$1
    # Results go to $OUT/results/ and leave as one archive, $OUT/results.tgz (a device call
    # returns at most 8 files), also when a deadline stops a test: GLMC_GPU_BUDGET seconds
    # (default 570, under the call's 600) for the whole run. The checks that time nothing run
    # together (the harness with 3 test threads, next to the oracle and trace tests, which run
    # the carried glmc); then the timing tests one at a time, alone on the GPU.
    shift
    top="${OUT:-/tmp/glmc-gpu}"
    results="$top/results"
    mkdir -p "$results"
    export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_GPU_OUT="$results"
    export GLMC_CACHE_DIR="${GLMC_CACHE_DIR:-/tmp/glmc-cache}"
    command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
    start=$SECONDS
    deadline=$((start + ${GLMC_GPU_BUDGET:-570}))
    trap 'tar czf "$top/results.tgz" -C "$top" results && rm -rf "$results"' EXIT
    {
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
        nvcc --version | tail -1
    } >"$results/times.txt"
    status=0
    # run_tests LABEL BINARY THREADS ARGS...: one test binary, under the time left.
    run_tests() {
        local label=$1 bin=$2 threads=$3 left=$((deadline - SECONDS)) rc=0
        shift 3
        if [ $left -le 5 ]; then
            echo "$label: not run, no time left" >>"$results/times.txt"
            return 1
        fi
        timeout $left ".gpu/$bin" --ignored --test-threads=$threads --nocapture "$@" >"$results/$label.txt" 2>&1 || rc=$?
        echo "$label: exit $rc at $((SECONDS - start)) s" >>"$results/times.txt"
        return $rc
    }
    # A glmc that a test started and left running when its time ran out would hold GPU memory
    # into the next test.
    stop_strays() { pkill -x glmc || true; }
    if [ "$mode" = run-tp ]; then
        # NVLink multicast stays off (the GPU host's rule: it can take the shared GPUs out of
        # service), and NCCL registers no buffers in captured graphs (the arena is pool memory).
        export NCCL_NVLS_ENABLE=0 NCCL_GRAPH_REGISTER=0
        # cudarc opens libnccl.so, and the NCCL of a pip wheel ships only libnccl.so.2.
        if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
            nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
            if [ -f "$nccl/libnccl.so.2" ]; then
                mkdir -p /tmp/glmc-nccl
                ln -sf "$nccl/libnccl.so.2" /tmp/glmc-nccl/libnccl.so
                export LD_LIBRARY_PATH="/tmp/glmc-nccl:$nccl:${LD_LIBRARY_PATH:-}"
            fi
        fi
        echo "NCCL: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE, LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >>"$results/times.txt"
        # The fault tests first (short, and they show a failing group exits), then --trace and
        # --check-finite at --tp 2, the f32 oracle comparison, bf16, and the speed runs, one
        # test at a time on both GPUs.
        nvidia-smi topo -m >>"$results/times.txt" 2>&1 || true
        for group in a_rank_that traced_tp2 oracle_fixture glm5_2layer bf16_tp2 decode_step_time; do
            run_tests "tp-$group" tp_gpu 1 "$group" "$@" || status=1
            stop_strays
        done
        cat "$results/times.txt"
        exit $status
    fi
    run_tests checks gpu_kernels 3 --skip timed --skip bandwidth "$@" &
    checks=$!
    run_tests oracle oracle 1 "$@" || status=1
    run_tests trace trace 1 "$@" || status=1
    wait $checks || status=1
    stop_strays
    run_tests timed gpu_kernels 1 timed bandwidth "$@" || status=1
    run_tests glm5 glm5_gpu 1 "$@" || status=1
    stop_strays
    # torch.matmul on the GEMM shapes the harness timed
    if [ -f "$results/gemm.json" ]; then
        python3 scripts/torch_gemm.py "$results/gemm.json" "$results/gemm_torch.md" || status=1
    fi
    cat "$results/times.txt"
    exit $status
    ;;
*)
    echo "usage: $0 build | run [TEST-BINARY ARGS] | run-tp [TEST-BINARY ARGS]" >&2
    exit 2
    ;;
esac
