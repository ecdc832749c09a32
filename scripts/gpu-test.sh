#!/usr/bin/env bash
# The GPU tests, in two halves around one device call.
#
#   scripts/gpu-test.sh build   # here: builds the GPU test binaries (release, no debug info)
#                               # into .gpu/ (git-ignored), small enough to carry (< 64 MiB)
#   scripts/gpu-test.sh run [ARGS]    # on the GPU machine, from the repository root: runs them
#                               # all; ARGS go to every test binary (a name filter, or
#                               # `--skip NAME` to leave the timing runs out when device time is short)
#
# The device call carries `.gpu` and runs `scripts/gpu-test.sh run`; results land in $OUT
# (harness.txt, sampling.txt, bandwidth.md, gemm.md, gemm_torch.md, log.txt) and are recorded in
# tests/gpu/README.md.
# The oracle's, the traces' and the GLM-5-sized GPU tests run the `glmc` binary carried in .gpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
build)
    mkdir -p .gpu
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
    cargo build --release --locked --bin glmc
    cp target/release/glmc .gpu/glmc
    # The test binaries with GPU tests, by name: the kernel harness, the oracle, the
    # cross-device traces and the GLM-5-sized runs.
    cargo test --release --locked -p glmc-runtime --test gpu_kernels -p glmc --test oracle --test trace --test glm5_gpu \
        --no-run --message-format=json |
        python3 -c 'import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("gpu_kernels", "oracle", "trace", "glm5_gpu"):
        shutil.copy(m["executable"], ".gpu/" + m["target"]["name"])'
    ls -la .gpu
    ;;
run)
    export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_GPU_OUT="${OUT:-/tmp}"
    export GLMC_CACHE_DIR="${GLMC_CACHE_DIR:-/tmp/glmc-cache}"
    command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    nvcc --version | tail -1
    shift
    status=0
    for t in gpu_kernels oracle trace glm5_gpu; do
        .gpu/$t --ignored --test-threads=1 --nocapture "$@" 2>&1 | tee -a "$GLMC_GPU_OUT/log.txt" || status=1
    done
    # torch.matmul on the GEMM shapes the harness timed
    if [ -f "$GLMC_GPU_OUT/gemm.json" ]; then
        python3 scripts/torch_gemm.py "$GLMC_GPU_OUT/gemm.json" "$GLMC_GPU_OUT/gemm_torch.md" || status=1
    fi
    exit $status
    ;;
*)
    echo "usage: $0 build | run [TEST-BINARY ARGS]" >&2
    exit 2
    ;;
esac
