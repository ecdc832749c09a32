#!/usr/bin/env bash
# The benchmarks (issue 13) on the H200 test host, in a few device calls of at most 10 minutes
# each, like scripts/gpu-test.sh: build here, carry `.gpu/`, run there, merge the JSON files.
#
#   scripts/bench-gpu.sh build                 # here: release glmc into .gpu/ (git-ignored, < 64 MiB)
#   scripts/bench-gpu.sh run glmc              # there: glmc bench (sparse and dense) and
#                                              # torch.matmul on its GEMM shapes, then plots (~4 min)
#   scripts/bench-gpu.sh run gemv              # there: issue 14's decode GEMM protocol: the GPU
#                                              # skinny sweep (needs `scripts/gpu-test.sh build`'s
#                                              # .gpu/gpu_kernels) and torch.matmul on its shapes (~2 min)
#   scripts/bench-gpu.sh run gemm              # there: issue 14's prefill GEMM protocol: the GPU
#                                              # tiled sweep (needs .gpu/gpu_kernels too) and
#                                              # torch.matmul on its shapes (~3 min)
#   scripts/bench-gpu.sh run attention         # there: issue 14's absorbed-attention targets: the
#                                              # GPU test that checks and times the kernels (needs
#                                              # .gpu/gpu_kernels too) into attention.json (~2 min)
#   scripts/bench-gpu.sh run indexer           # there: issue 14's indexer-scoring target the same
#                                              # way, from the indexer's GPU test (~20 s)
#   scripts/bench-gpu.sh run peers MODES [S]   # there: transformers in MODES (comma-separated:
#                                              # eager, max-autotune-no-cudagraphs, reduce-overhead),
#                                              # each under S seconds (default 240), then plots
#   scripts/bench-gpu.sh render DIR            # anywhere: DIR/*.json -> bench/RESULTS.md
#
# Each `run` writes into $OUT/bench.tgz (the device call's output folder): glmc.json / glmc.txt /
# matmul.json, gemv.json / gemv.md or gemm.json / gemm.md and the sweep's tables, attention.json
# or indexer.json and the test's tables, or hf-<modes>.json and one log per mode; RESULTS.md and the PNG plots are made from those plus every JSON of $BENCH_RESULTS
# (default bench/results/latest), where the lead puts the files of the earlier calls of the
# session so that the last call plots them all.
set -euo pipefail
cd "$(dirname "$0")/.."
# A device call returns at most 8 files: `run` writes into $OUT/bench/ and leaves one archive,
# $OUT/bench.tgz.
top="${OUT:-/tmp/glmc-bench}"
out="$top/bench"
results="${BENCH_RESULTS:-bench/results/latest}"
model=models/glm5-slice.ron
case "${1:-}" in
build)
    exec scripts/gpu-test.sh build glmc
    ;;
run)
    mkdir -p "$out"
    trap 'tar czf "$top/bench.tgz" -C "$top" bench && rm -rf "$out"' EXIT
    export GLMC_CACHE_DIR="${GLMC_CACHE_DIR:-/tmp/glmc-cache}"
    command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
    status=0
    # sweep TEST STEM NAME: the GPU sweep TEST (its report and shapes in sweep/STEM.md and .json),
    # then torch.matmul on those shapes, timed the same way, into NAME.md and NAME.json.
    sweep() {
        mkdir -p "$out/sweep"
        GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_GPU_OUT="$out/sweep" .gpu/gpu_kernels \
            --ignored --nocapture --exact "$1" >"$out/$3-sweep.txt" 2>&1 || status=1
        if [ -f "$out/sweep/$2.json" ]; then
            python3 scripts/torch_gemm.py "$out/sweep/$2.json" "$out/$3.md" "$out/$3.json" 2>&1 |
                tee "$out/$3.txt" || status=1
        fi
    }
    # test_result TEST KIND: the GPU test TEST, which checks and times KIND's kernels, its
    # tables in test/, its timings as KIND.json.
    test_result() {
        mkdir -p "$out/test"
        GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_GPU_OUT="$out/test" .gpu/gpu_kernels --ignored \
            --nocapture --exact "$1" >"$out/$2-test.txt" 2>&1 || status=1
        if [ -f "$out/test/$2.json" ]; then
            python3 scripts/gpu_test_result.py "$2" "$out/test/$2.json" "$out/$2.json" || status=1
        fi
    }
    case "${2:-}" in
    glmc)
        .gpu/glmc bench "$model" --device cuda --random-weights 1 --batch 1,8,64 \
            --context 1024,8192,32768 --prefill 4096 --attention sparse,dense \
            --json "$out/glmc.json" 2>&1 | tee "$out/glmc.txt" || status=1
        if [ -f "$out/glmc.json" ]; then
            python3 bench/peers/torch_matmul.py "$out/glmc.json" "$out/matmul.json" 2>&1 |
                tee "$out/matmul.txt" || status=1
        fi
        ;;
    gemv) sweep glm5_skinny_gemm_variants_are_timed skinny gemv ;;
    gemm) sweep glm5_tiled_gemm_variants_are_timed tiled gemm ;;
    attention) test_result glm5_absorbed_attention_matches_and_is_timed attention ;;
    indexer) test_result glm5_indexer_matches_and_is_timed indexer ;;
    peers)
        modes="${3:?run peers MODES [SECONDS]}"
        python3 bench/peers/hf_glm5.py --model "$model" --modes "$modes" --batch 1,8 \
            --context 1024,8192 --timeout "${4:-240}" --out "$out/hf-${modes//,/+}.json" 2>&1 |
            tee "$out/hf-${modes//,/+}.txt" || status=1
        ;;
    *)
        echo "usage: $0 run glmc | run gemv | run gemm | run attention | run indexer | run peers MODES [SECONDS]" >&2
        exit 2
        ;;
    esac
    shopt -s nullglob
    inputs=("$out"/*.json "$results"/*.json)
    if [ ${#inputs[@]} -gt 0 ]; then
        python3 bench/render.py --out "$out/RESULTS.md" --merged "$out/merged.json.all" "${inputs[@]}" || status=1
        python3 bench/plot.py "$out" "${inputs[@]}" || status=1
    fi
    exit $status
    ;;
render)
    dir="${2:?render DIR}"
    python3 bench/render.py --out bench/RESULTS.md --merged "$dir/merged.json.all" "$dir"/*.json
    ;;
*)
    echo "usage: $0 build | run glmc | run gemv | run gemm | run attention | run indexer | run peers MODES [SECONDS] | render DIR" >&2
    exit 2
    ;;
esac
