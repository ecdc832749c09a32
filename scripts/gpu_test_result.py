#!/usr/bin/env python3
"""A GPU test's timings (the JSON it writes beside its markdown table) as a benchmark result file.

Usage: gpu_test_result.py KIND TEST_JSON OUT_JSON, KIND one of:
  attention  `glm5_absorbed_attention_matches_and_is_timed`'s attention.json
  indexer    `glm5_indexer_matches_and_is_timed`'s indexer.json
TEST_JSON holds the copy bandwidth and mma.sync rate the test measured and one entry per timed
case, each checked against the interpreter before it was timed (alone, its inputs rotated
through copies spanning twice the L2, back to back in a CUDA graph). OUT_JSON (schema
glmc-bench-KIND/1, from which bench/render.py judges issue 14's targets for those kernels) adds
what made it, when and on which GPU.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "peers"))
from torch_matmul import run_header  # noqa: E402

TOOLS = {"attention": "glmc GPU test (absorbed attention)", "indexer": "glmc GPU test (indexer)"}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in TOOLS:
        sys.exit(f"usage: gpu_test_result.py {{{','.join(TOOLS)}}} TEST_JSON OUT_JSON")
    kind, test_json, out_json = sys.argv[1:]
    test = json.load(open(test_json))
    doc = dict(run_header(f"glmc-bench-{kind}/1", TOOLS[kind]), **test)
    json.dump(doc, open(out_json, "w"), indent=1)
    print(f"{len(doc['cases'])} cases into {out_json}")


if __name__ == "__main__":
    main()
