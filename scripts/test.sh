#!/usr/bin/env bash
# The whole test suite: installs the pinned CUDA compiler (scripts/cuda-toolchain.sh), so the
# tests that compile every generated kernel for sm_120a and sm_90a never skip, then runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
GLMC_NVCC=$(scripts/cuda-toolchain.sh)
export GLMC_NVCC
export PATH="$(dirname "$GLMC_NVCC"):$PATH"
cargo test --workspace --locked "$@"
