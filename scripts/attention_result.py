#!/usr/bin/env python3
"""The absorbed-attention GPU test's timings (its attention.json) as a benchmark result file.

Usage: attention_result.py TEST_JSON OUT_JSON. TEST_JSON is what
`glm5_absorbed_attention_matches_and_is_timed` writes beside attention.md: the copy bandwidth
and mma.sync rate it measured and one entry per timed case (each checked against the
interpreter before it was timed). OUT_JSON (schema glmc-bench-attention/1, from which
bench/render.py judges issue 14's absorbed-attention targets) adds what made it, when and on
which GPU.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "peers"))
from torch_matmul import run_header  # noqa: E402


def main():
    test = json.load(open(sys.argv[1]))
    doc = dict(run_header("glmc-bench-attention/1", "glmc GPU test (absorbed attention)"), **test)
    json.dump(doc, open(sys.argv[2], "w"), indent=1)
    print(f"{len(doc['cases'])} cases into {sys.argv[2]}")


if __name__ == "__main__":
    main()
