#!/usr/bin/env bash
# Installs the pinned CUDA 13.0 compiler (nvcc, ptxas, headers) from PyPI wheels into a cache and
# prints the path of its nvcc. No GPU and no system CUDA needed. Every wheel is pinned to 13.0:
# an unpinned nvcc pulls 13.5 parts, whose PTX the test GPU's driver (580) rejects.
#
#   GLMC_NVCC=$(scripts/cuda-toolchain.sh) glmc compile models/glm5.ron --target sm120
#
# Also installs cuobjdump/nvdisasm (13.2: no 13.0 wheel exists) to read SASS. The cache lives in
# $GLMC_CUDA_HOME (default ~/.cache/glmc-cuda130); a second run only checks it.
set -euo pipefail
home="${GLMC_CUDA_HOME:-$HOME/.cache/glmc-cuda130}"
stamp="$home/.installed-13.0.88"
if [[ ! -f "$stamp" ]]; then
    echo "installing the pinned CUDA 13.0 compiler wheels into $home (about 200 MB, once)" >&2
    python3 -m venv "$home" >&2
    "$home/bin/pip" install --quiet --disable-pip-version-check \
        nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 \
        nvidia-cuda-cuobjdump==13.2.51 nvidia-cuda-nvdisasm==13.2.51 >&2
    touch "$stamp"
fi
nv=$(echo "$home"/lib/python3*/site-packages/nvidia/cu13)
if [[ ! -x "$nv/bin/nvcc" ]]; then
    echo "error: $nv/bin/nvcc is missing; remove $home and run $0 again" >&2
    exit 2
fi
echo "$nv/bin/nvcc"
