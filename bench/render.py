#!/usr/bin/env python3
"""Merges benchmark JSON files and renders them as markdown (bench/RESULTS.md).

Usage: render.py [--out FILE] [--merged FILE] JSON...

Each JSON is one of (bench/README.md documents the fields):
  glmc-bench/1         `glmc bench --json` (one per device call; several are merged by run)
  glmc-bench-peer/1    bench/peers/hf_glm5.py: transformers' GlmMoeDsaForCausalLM, one or more modes
  glmc-bench-matmul/1  bench/peers/torch_matmul.py: torch.matmul on glmc's GEMM shapes
  glmc-bench-gemv/1    scripts/torch_gemm.py on a GPU GEMM sweep: glmc and torch.matmul on
                       the decode GEMMs (the skinny sweep) or the prefill GEMMs (the tiled
                       sweep) under issue 14's protocol
  glmc-bench-attention/1  scripts/gpu_test_result.py on the absorbed-attention GPU test's
                       timings (each case checked against the interpreter first)
  glmc-bench-indexer/1 the same on the indexer's GPU test (dsa.score and dsa.topk)

Nothing is computed here that the files do not hold, except ratios of their numbers. A file
marked "fixture" (the unit tests' invented sample) makes the page say so at the top, so a page
rendered from one can never pass for results. Standard library only: CI runs the tests without
any extra package.
"""
import argparse
import json
import re
import sys

GLMC, PEER, MATMUL, GEMV = "glmc-bench/1", "glmc-bench-peer/1", "glmc-bench-matmul/1", "glmc-bench-gemv/1"
ATTENTION, INDEXER = "glmc-bench-attention/1", "glmc-bench-indexer/1"
DASH = "—"
# Issue 14's decode GEMM target: 1–8 rows; weights of 64 MB or more must reach 85% of the copy
# bandwidth, smaller ones 75%.
GEMV_ROWS, GEMV_LARGE_BYTES = 8, 64 << 20


def load(paths):
    """The documents of `paths`, grouped by schema; an unknown schema is an error."""
    docs = {GLMC: [], PEER: [], MATMUL: [], GEMV: [], ATTENTION: [], INDEXER: []}
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        schema = doc.get("schema")
        if schema not in docs:
            raise ValueError(f"{p}: unknown schema {schema!r} (expected one of {', '.join(docs)})")
        doc["_path"] = p
        docs[schema].append(doc)
    return docs


def merged(docs):
    """One JSON document holding every input, for the record."""
    return {
        "schema": "glmc-bench-merged/1",
        "sources": [{k: v for k, v in d.items() if k != "_path"} for ds in docs.values() for d in ds],
    }


def fold(node):
    """`model.layers.12.mlp.gate` -> `model.layers.*.mlp.gate` (as glmc compile --report folds)."""
    return re.sub(r"^model\.layers\.\d+\.", "model.layers.*.", node)


def ms(seconds):
    return DASH if seconds is None else f"{seconds * 1e3:.3f}"


def pct(x):
    return DASH if x is None else f"{x * 100:.1f}%"


def num(x, digits=1):
    return DASH if x is None else f"{x:,.{digits}f}"


def read_cells(read_us, time_us):
    """The read ceiling's time and its share of the measured time: dashes where none was measured."""
    return [num(read_us), pct(None if read_us is None else read_us / time_us)]


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def glmc_points(docs, phase):
    """(attention, point) of every glmc run, in file order."""
    for d in docs[GLMC]:
        for run in d["runs"]:
            for p in run.get(phase, []):
                yield run["attention"], p


def peer_decode(docs):
    """{(mode label, batch, context): point} over every peer file."""
    out = {}
    for d in docs[PEER]:
        for m in d["modes"]:
            for p in m.get("decode", []):
                out[(m["mode"], p["batch"], p["context"])] = p
    return out


def peer_modes(docs):
    labels = []
    for d in docs[PEER]:
        for m in d["modes"]:
            if m["mode"] not in labels:
                labels.append(m["mode"])
    return labels


def render(docs):
    lines = ["# glmc benchmark results", ""]
    fixtures = [d["_path"] for ds in docs.values() for d in ds if d.get("fixture")]
    if fixtures:
        lines += [
            "**SCHEMA FIXTURE, NOT A RESULT**: rendered from "
            + ", ".join(fixtures)
            + ", whose numbers are invented to test the renderer.",
            "",
        ]
    lines += [
        "Written by `bench/render.py` from the JSON files of `scripts/bench-gpu.sh`; every number is",
        "measured in the runs listed below, except the columns named roofline and predicted, which",
        "are computed (bench/README.md says how).",
        "",
        "## Runs",
        "",
    ]
    rows = []
    for ds in docs.values():
        for d in ds:
            dev = d.get("device", {})
            rows.append([d.get("tool", "?"), d.get("date", "?"), dev.get("name", "?"), f"`{d.get('command', '?')}`"])
    lines += table(["tool", "date", "device", "command"], rows)

    for d in docs[GLMC]:
        c = d["ceilings"]
        lines += [
            "",
            f"glmc run of {d['date']}: {d['model']} ({d['dtype']}, weights {d['weights']}; contexts stated by "
            f"{d['contexts_stated_by']}) on {d['device']['name']} ({d['device']['target']}). Ceilings measured in "
            f"that run: copy {c['copy_gbs']:.0f} GB/s, bf16 mma.sync {c['mma_tflops']:.0f} TFLOP/s (after the model: "
            f"{c['copy_gbs_after']:.0f} GB/s, {c['mma_tflops_after']:.0f} TFLOP/s); the cost model assumes "
            f"{c['cost_model_gbs']:.0f} GB/s and {c['cost_model_tflops']:.0f} TFLOP/s.",
        ]

    lines += targets_section(docs)
    lines += decode_section(docs)
    lines += prefill_section(docs)
    lines += overhead_section(docs)
    lines += kernel_section(docs)
    lines += peer_section(docs)
    lines += gemv_section(docs)
    lines += prefill_sweep_section(docs)
    lines += attention_section(docs)
    lines += indexer_section(docs)
    lines += matmul_section(docs)
    return "\n".join(lines) + "\n"


def yes_no(ok):
    return DASH if ok is None else ("met" if ok else "missed")


def glmc_point(docs, attention, phase, rows, context):
    """The last glmc point of that setting, or None."""
    found = None
    for a, p in glmc_points(docs, phase):
        if a == attention and p["rows"] == rows and p["context"] == context:
            found = p
    return found


def op_time(point, op):
    return sum(k["time_s"] for k in point["kernels"] if k["op"] == op)


def targets_section(docs):
    """Issue 14's targets that these files measure, with the measured value and whether it is
    met (the page's text says what is measured where)."""
    rows = []
    attentions = []
    for a, _ in glmc_points(docs, "decode"):
        if a not in attentions:
            attentions.append(a)
    peers = peer_decode(docs)
    for a in attentions:
        for context in (1024, 8192):
            p = glmc_point(docs, a, "decode", 1, context)
            if p is None:
                continue
            lat = decode_latency(p)
            frac = p["roofline_s"] / lat
            rows.append([f"decode, batch 1, context {context}, {a}: ≥ 75% of the roofline", pct(frac), yes_no(frac >= 0.75)])
            ran = [(q["step_s"]["median"], m) for (m, b, c), q in peers.items() if b == 1 and c == context and q.get("step_s")]
            if ran:
                best, mode = min(ran)
                rows.append(
                    [f"decode, batch 1, context {context}, {a}: faster than the best PyTorch peer", f"{ms(lat)} ms against {mode}'s {ms(best)} ms", yes_no(lat < best)]
                )
    rows += gemv_targets(docs)
    rows += attention_targets(docs)
    # Judged where glmc's kernel and torch.matmul were timed the same way (the tiled sweep, each
    # shape alone); the in-model times of matmul.json only where no sweep ran.
    pre = prefill_sweep_shapes(docs)
    how = f"each shape alone, as torch.matmul, on {sweep_devices(docs, 'prefill')}"
    if not pre:
        shapes = [s for d in docs[MATMUL] for s in d["shapes"] if s.get("torch_us")]
        pre = [s for s in shapes if s["phase"] == "prefill" and s["dtype"] == "bf16"]
        how = "in the model"
    if pre:
        worst = min(pre, key=lambda s: s["torch_us"] / s["glmc_us"])
        rate = worst["torch_us"] / worst["glmc_us"]
        rows.append(
            [
                "prefill bf16 GEMMs ≥ 50% of torch.matmul's rate",
                f"{pct(rate)} at the worst, `{fold(shipped_node(worst['node']))}` ({how})",
                yes_no(rate >= 0.5),
            ]
        )
    sparse, dense = glmc_point(docs, "sparse", "decode", 8, 32768), glmc_point(docs, "dense", "decode", 8, 32768)
    per_launch = None
    if sparse is not None:
        scores = [k for k in sparse["kernels"] if k["op"] == "dsa.score" and k.get("roofline_s") is not None]
        if scores:
            per_launch = sum(k["roofline_s"] for k in scores) / sum(k["time_s"] for k in scores)
    rows += indexer_targets(docs, per_launch)
    if sparse is not None:
        dense_attention = op_time(dense, "mla.attend.absorbed") if dense is not None else 0.0
        if dense_attention > 0:
            picked = sum(op_time(sparse, op) for op in ("dsa.score", "dsa.topk", "mla.attend.absorbed"))
            ratio = picked / dense_attention
            rows.append(
                ["decode, batch 8, context 32768: indexer + top-k + sparse attention ≤ 0.5× dense absorbed attention", f"{ratio:.2f}×", yes_no(ratio <= 0.5)]
            )
    for a in attentions:
        p = glmc_point(docs, a, "decode", 1, 1024)
        if p is not None and p.get("sum_kernels_s"):
            ratio = decode_latency(p) / p["sum_kernels_s"]
            rows.append(
                [f"decode, batch 1, context 1024, {a}: the step within 10% of the sum of its kernels", f"{ratio:.2f}× the sum", yes_no(ratio <= 1.1)]
            )
    if not rows:
        return []
    return [
        "",
        "## Targets (issue 14)",
        "",
        "Each target these files measure. The decode GEMM targets are judged under their own protocol",
        "(each shape alone, weights from DRAM, back to back in a CUDA graph: the GPU skinny sweep and",
        "torch.matmul timed the same way, `scripts/bench-gpu.sh run gemv`), and so are the prefill",
        "GEMMs where the tiled sweep ran (`scripts/bench-gpu.sh run gemm`); the absorbed-attention",
        "targets and the indexer's scoring where they ran by the GPU tests that check their kernels",
        "the same way (`scripts/bench-gpu.sh run attention`, `run indexer`), else from the bench's",
        "kernels, each between CUDA events of its own. The table of torch.matmul on",
        "glmc's GEMM shapes at the end times glmc's GEMMs inside the model instead, launch by launch,",
        "so a short kernel's launch latency counts there.",
        "",
    ] + table(["target", "measured", ""], rows) + gaps_section(docs)


def op_gaps(point, top):
    """The op kinds of a point whose measured time most exceeds their roofline time (nodes with
    no roofline count whole), each with its share of the point's excess."""
    per_op = {}
    for k in point["kernels"]:
        g = per_op.setdefault(k["op"], {"time_s": 0.0, "roofline_s": 0.0, "launches": 0})
        g["time_s"] += k["time_s"]
        g["roofline_s"] += k.get("roofline_s") or 0.0
        g["launches"] += k["launches"]
    excess = {op: g["time_s"] - g["roofline_s"] for op, g in per_op.items()}
    total = sum(max(e, 0.0) for e in excess.values())
    rows = []
    over = [(op, e) for op, e in excess.items() if e > 0]
    for op, e in sorted(over, key=lambda kv: -kv[1])[:top]:
        g = per_op[op]
        rows.append([op, g["launches"], num(g["time_s"] * 1e6), num(g["roofline_s"] * 1e6), num(e * 1e6), pct(e / total if total > 0 else None)])
    return rows


def weight_bytes(s):
    return s["heads"] * s["n"] * s["k"] * (2 if s["dtype"] == "bf16" else 4)


def gemv_fraction(s, copy_gbs):
    """The share of the copy bandwidth a GEMM's bytes (weights, x and y) moved at."""
    return s["bytes"] / (s["glmc_us"] * 1e-6) / (copy_gbs * 1e9)


SHIPPED = " [shipped "


def shipped_node(node):
    """A sweep's node name without its `[shipped …]` tag."""
    return node.split(SHIPPED)[0]


def prefill_sweep_shapes(docs):
    """The tiled sweep's shipped prefill GEMMs (bf16) with torch.matmul's time beside them."""
    return [
        s
        for d in docs[GEMV]
        for s in d["shapes"]
        if s["phase"] == "prefill" and s["dtype"] == "bf16" and SHIPPED in s["node"] and s.get("torch_us")
    ]


def sweep_devices(docs, phase):
    """The GPUs the sweeps of `phase` ran on: the judged ratios hold on them alone."""
    names = {d.get("device", {}).get("name", "?") for d in docs[GEMV] if any(s["phase"] == phase for s in d["shapes"])}
    return ", ".join(sorted(names))


def prefill_sweep_section(docs):
    """Every shipped prefill GEMM of the tiled sweep against torch.matmul, timed the same way."""
    rows = []
    for s in prefill_sweep_shapes(docs):
        tile = s["node"].split(SHIPPED)[1].rstrip("]")
        rows.append(
            [
                f"`{fold(shipped_node(s['node']))}`",
                f"{s['heads']} × {s['n']} × {s['k']}",
                tile,
                num(s["glmc_us"]),
                num(s["flops"] / s["glmc_us"] / 1e6),
                num(s["torch_us"]),
                num(s["flops"] / s["torch_us"] / 1e6),
                pct(s["torch_us"] / s["glmc_us"]),
            ]
        )
    if not rows:
        return []
    dates = ", ".join(d.get("date", "?") for d in docs[GEMV] if any(s["phase"] == "prefill" for s in d["shapes"]))
    return [
        "",
        "## Prefill GEMMs under issue 14's protocol",
        "",
        "The GPU tiled sweep's shipped tile on every GLM-5 prefill GEMM at 4096 rows and torch.matmul",
        "on the same shape, each alone with its operands rotated through copies spanning twice the L2,",
        f"back to back in a CUDA graph, in one call on {sweep_devices(docs, 'prefill')} ({dates}; `scripts/bench-gpu.sh run gemm`).",
        "",
    ] + table(["node (layers folded)", "heads × N × K", "tile", "glmc us", "glmc TFLOP/s", "torch us", "torch TFLOP/s", "of torch's rate"], rows)


# Issue 14's absorbed-attention targets: decode at batch 64 over 32k contexts (2048 keys picked
# a row), the 8 heads of a rank at TP=8 against the copy bandwidth, all 64 against the roofline.
ATTENTION_ROWS, ATTENTION_CONTEXT = 64, 32768
def copy_fraction(d, c):
    return c["bytes"] / (c["time_us"] * 1e-6) / (d["copy_gbs"] * 1e9)


def roofline_fraction(d, c):
    return c["roofline_us"] / c["time_us"]


ATTENTION_TARGETS = ((8, "of the copy bandwidth", 0.8, copy_fraction), (64, "of its roofline", 0.6, roofline_fraction))


def attention_case(d, heads):
    """The shipped kernel's case of the target shape in an attention run, if it ran."""
    for c in d["cases"]:
        if (c["case"], c["heads"], c["rows"], c["context"]) == ("decode", heads, ATTENTION_ROWS, ATTENTION_CONTEXT):
            return c
    return None


def attention_targets(docs):
    rows = []
    for d in docs[ATTENTION]:
        for heads, what, goal, fraction in ATTENTION_TARGETS:
            c = attention_case(d, heads)
            if c is None:
                continue
            frac = fraction(d, c)
            rows.append(
                [
                    f"absorbed attention, batch {ATTENTION_ROWS}, context {ATTENTION_CONTEXT}, {heads} heads: ≥ {goal * 100:.0f}% {what}",
                    f"{pct(frac)} ({num(c['time_us'])} us on {d['device']['name']})",
                    yes_no(frac >= goal),
                ]
            )
    return rows


INDEXER_ROWS, INDEXER_CONTEXT = 8, 32768


def indexer_targets(docs, per_launch):
    """The indexer-scoring target: from each indexer test run (the shipped ring's case), with the
    bench's per-launch fraction beside it; from the bench alone where no test ran."""
    goal = 0.7
    what = f"decode, batch {INDEXER_ROWS}, context {INDEXER_CONTEXT}: indexer scoring ≥ {goal * 100:.0f}% of its roofline"
    bench = f"the bench's kernels, each between events of its own: {pct(per_launch)}" if per_launch is not None else None
    rows = []
    for d in docs[INDEXER]:
        c = indexer_case(d)
        if c is None:
            continue
        frac = roofline_fraction(d, c)
        how = f"{num(c['time_us'])} us on {d['device']['name']}, the GPU test" + (f"; {bench}" if bench else "")
        rows.append([what, f"{pct(frac)} ({how})", yes_no(frac >= goal)])
    if not rows and per_launch is not None:
        rows.append([what, pct(per_launch), yes_no(per_launch >= goal)])
    return rows


def indexer_case(d):
    """The shipped kernel's dsa.score at the target's shape in an indexer run, if it ran."""
    for c in d["cases"]:
        if (c["case"], c["op"], c["variant"], c["rows"], c["context"]) == ("decode", "dsa.score", None, INDEXER_ROWS, INDEXER_CONTEXT):
            return c
    return None


def gpu_test_section(docs, schema, heading, intro, header, row, keep):
    """One table per GPU test run of `schema`: `row(d, c)` of each case `keep(c)` holds, under
    `heading` and `intro(d)`."""
    lines = []
    for d in docs[schema]:
        rows = [row(d, c) for c in d["cases"] if keep(c)]
        if rows:
            lines += ["", heading, "", intro(d), ""] + table(header, rows)
    return lines


def rates(d, c):
    """A timed case's time, GB/s and fraction of its roofline, as the tables print them."""
    return [num(c["time_us"]), num(c["bytes"] / c["time_us"] / 1e3, 0), pct(roofline_fraction(d, c))]


def indexer_section(docs):
    """Every decode scoring case of the indexer runs past one row: the shipped ring and the
    variants timed beside it."""
    return gpu_test_section(
        docs,
        INDEXER,
        "## Indexer scoring at decode",
        lambda d: f"The indexer GPU test's decode `dsa.score` cases on {d['device']['name']} ({d.get('date', '?')}; "
        f"`scripts/bench-gpu.sh run indexer`; copy {d['copy_gbs']:.0f} GB/s): each kernel alone, its keys rotated "
        "through copies spanning twice the L2, back to back in a CUDA graph, each case checked against the "
        "interpreter before it was timed.",
        ["case", "ring", "kernels", "us", "GB/s", "of roofline"],
        lambda d, c: [f"{c['case']} {c['rows']} × {c['context']}", c["variant"] or "shipped", c["kernels"]] + rates(d, c),
        lambda c: c["op"] == "dsa.score" and c["case"].startswith("decode") and c["rows"] > 1,
    )


def attention_section(docs):
    """Every decode case of the absorbed-attention runs at batch 64: the shipped kernel and the
    variants timed beside it."""
    return gpu_test_section(
        docs,
        ATTENTION,
        "## Absorbed attention at batch 64",
        lambda d: f"The GPU test's decode cases at batch {ATTENTION_ROWS} on {d['device']['name']} ({d.get('date', '?')}; "
        f"`scripts/bench-gpu.sh run attention`; copy {d['copy_gbs']:.0f} GB/s, mma.sync {d['mma_tflops']:.0f} TFLOP/s): "
        "each row's 2048 top-k keys past 2048 tokens, each case checked against the interpreter before it was timed. "
        "`read us` is the gather ceiling where the test measured one: a kernel that only reads the keys the top-k "
        "lists name (1152 bytes each), timed the same way at its fastest configuration (`gather_ceiling` in "
        "runtime/src/cuda/ceiling.rs); `of read` is it over the case's time.",
        ["case", "heads", "context", "kernels", "us", "GB/s", "of roofline", "read us", "of read"],
        lambda d, c: [c["case"], c["heads"], c["context"], c["kernels"]]
        + rates(d, c)
        + read_cells(c.get("read_us"), c["time_us"]),
        lambda c: c["phase"] == "decode" and c["rows"] == ATTENTION_ROWS,
    )


def gemv_targets(docs):
    """Issue 14's decode GEMM targets (1–8 rows) from the sweeps under its protocol."""
    rows = []
    for d in docs[GEMV]:
        shapes = [s for s in d["shapes"] if s["phase"] == "decode" and s["rows"] <= GEMV_ROWS]
        if not shapes:
            continue
        for large, floor in ((True, 0.85), (False, 0.75)):
            group = [s for s in shapes if (weight_bytes(s) >= GEMV_LARGE_BYTES) == large]
            if not group:
                continue
            worst = min(group, key=lambda s: gemv_fraction(s, d["copy_gbs"]))
            frac = gemv_fraction(worst, d["copy_gbs"])
            size = "64 MB or more" if large else "under 64 MB"
            rows.append(
                [
                    f"decode GEMMs, 1–{GEMV_ROWS} rows, weights of {size}: ≥ {floor * 100:.0f}% of the copy bandwidth",
                    f"{pct(frac)} at the worst, `{fold(worst['node'])}` at {worst['rows']} rows",
                    yes_no(frac >= floor),
                ]
            )
        slower = [s for s in shapes if s["glmc_us"] > s["torch_us"]]
        worst = max(shapes, key=lambda s: s["glmc_us"] / s["torch_us"])
        rows.append(
            [
                f"decode GEMMs, 1–{GEMV_ROWS} rows: never slower than torch.matmul under the same rotation",
                f"{len(slower)} of {len(shapes)} slower; worst `{fold(worst['node'])}` at {worst['rows']} rows, "
                f"{worst['glmc_us'] / worst['torch_us']:.2f}×",
                yes_no(not slower),
            ]
        )
    return rows


def gemv_section(docs):
    """Every shape of the sweeps: glmc's time, its share of the copy bandwidth, the read ceiling
    and glmc's share of it (dashes where the sweep predates the ceiling) and torch's time."""
    rows = []
    for d in docs[GEMV]:
        for s in d["shapes"]:
            if s["phase"] != "decode":
                continue
            rows.append(
                [
                    s["rows"],
                    f"`{fold(s['node'])}`",
                    f"{s['heads']} × {s['n']} × {s['k']}",
                    num(weight_bytes(s) / 2**20),
                    num(s["glmc_us"]),
                    pct(gemv_fraction(s, d["copy_gbs"])),
                    *read_cells(s.get("read_us"), s["glmc_us"]),
                    num(s["torch_us"]),
                    num(s["glmc_us"] / s["torch_us"], 2),
                ]
            )
    if not rows:
        return []
    bandwidth = ", ".join(
        f"{d['copy_gbs']:.0f} GB/s ({d.get('date', '?')})" for d in docs[GEMV] if any(s["phase"] == "decode" for s in d["shapes"])
    )
    return [
        "",
        "## Decode GEMMs under issue 14's protocol",
        "",
        "The GPU skinny sweep's shipped kernels and torch.matmul, each shape alone with its operands",
        "rotated through copies spanning twice the L2 (weights from DRAM), back to back in a CUDA",
        f"graph; `of copy` is the bytes moved over the copy bandwidth measured in that call: {bandwidth}.",
        "`read us` is the read ceiling, the best any kernel can do under this protocol, launches",
        "included: a kernel that only reads the weight's bytes (not x or y), timed the same way in the",
        "sweep's run, at its fastest configuration (`read_ceiling` in runtime/src/cuda/ceiling.rs);",
        "`of read` is it over glmc's time. The targets stay judged against the copy bandwidth. A dash:",
        "the sweep predates the read ceiling.",
        "",
    ] + table(
        ["rows", "node (layers folded)", "heads × N × K", "weight MiB", "glmc us", "of copy", "read us", "of read", "torch us", "glmc / torch"],
        rows,
    )


def gaps_section(docs, top=8):
    """Where the batch-1 decode steps lose their time against the roofline, op by op."""
    out = []
    for a in ("sparse", "dense"):
        for context in (1024, 8192):
            p = glmc_point(docs, a, "decode", 1, context)
            if p is None:
                continue
            out += ["", f"Decode, batch 1, context {context}, {a}: the op kinds that exceed their roofline most (each kernel timed between CUDA events of its own, so a small kernel's few µs are mostly its launch)", ""]
            out += table(["op", "launches", "time us", "roofline us", "over us", "of all over"], op_gaps(p, top))
    if out:
        out = ["", "### Where batch 1 loses its time"] + out
    return out


def decode_section(docs):
    glmc = {}
    attentions = []
    for a, p in glmc_points(docs, "decode"):
        glmc[(a, p["rows"], p["context"])] = p
        if a not in attentions:
            attentions.append(a)
    peers = peer_decode(docs)
    modes = peer_modes(docs)
    keys = sorted({(b, c) for _, b, c in glmc} | {(b, c) for _, b, c in peers}, key=lambda k: (k[1], k[0]))
    if not keys:
        return []
    header = ["batch", "context"]
    for a in attentions:
        header += [f"glmc {a} ms", f"glmc {a} tok/s", f"{a} roofline ms", f"{a} of roofline", f"{a} predicted ms"]
    for m in modes:
        header += [f"HF {m} ms", f"HF {m} tok/s"]
    rows = []
    for b, c in keys:
        row = [b, c]
        for a in attentions:
            p = glmc.get((a, b, c))
            if p:
                lat = decode_latency(p)
                row += [ms(lat), num(p["rows"] / lat), ms(p["roofline_s"]), pct(p["roofline_s"] / lat), ms(p["predicted_s"])]
            else:
                row += [DASH] * 5
        for m in modes:
            p = peers.get((m, b, c))
            ok = p is not None and p.get("step_s") is not None
            row += [ms(p["step_s"]["median"]), num(p["tokens_per_s"])] if ok else [DASH, DASH]
        rows.append(row)
    return [
        "",
        "## Decode",
        "",
        "Step latency (median) as `glmc run` decodes, replayed from the step's CUDA graph (a run from",
        "before CUDA graphs: launched kernel by kernel; both are under Launch overhead below),",
        "tokens/s (batch / latency), the step's roofline (bytes at the measured",
        "copy bandwidth or FLOPs at the measured mma.sync rate, whichever is longer) and what fraction",
        "of it the step reaches, and `glmc compile --report`'s predicted step time for the same setting.",
        "",
    ] + table(header, rows)


def decode_latency(point):
    """A glmc decode point's step time as `glmc run` takes it: from its CUDA graph where the run
    measured one."""
    return graph_step(point) or point["step_s"]["median"]


def graph_step(point):
    """The median decode step replayed from its CUDA graph, or None (prefill, or a run from
    before CUDA graphs)."""
    return (point.get("graph_step_s") or {}).get("median")


def prefill_section(docs):
    rows = [
        [a, p["rows"], ms(p["step_s"]["median"]), num(p["tokens_per_s"]), ms(p["roofline_s"]), pct(p["roofline_fraction"]), ms(p["predicted_s"])]
        for a, p in glmc_points(docs, "prefill")
    ]
    if not rows:
        return []
    return ["", "## Prefill", ""] + table(
        ["attention", "tokens", "step ms", "tokens/s", "roofline ms", "of roofline", "predicted ms"], rows
    )


def overhead_section(docs):
    rows = []
    for phase in ("prefill", "decode"):
        for a, p in glmc_points(docs, phase):
            step = p["step_s"]["median"]
            # Runs before CUDA graphs (and prefill, which has none) have no graph step.
            graph = graph_step(p)
            rows.append(
                [
                    a,
                    phase,
                    p["rows"],
                    p["context"],
                    p["launches"],
                    ms(step),
                    ms(p["gpu_step_s"]["median"]),
                    ms(p["sum_kernels_s"]),
                    ms(p["launch_overhead_s"]),
                    pct(p["launch_overhead_s"] / step if step else None),
                    ms(graph),
                    pct((step - graph) / step if graph is not None and step else None),
                ]
            )
    if not rows:
        return []
    return [
        "",
        "## Launch overhead",
        "",
        "The step's wall time against the sum of its kernels' times (each between CUDA events of its",
        "own): the difference is launch overhead and the gaps between kernels. A decode step also",
        "runs replayed from its CUDA graph, as `glmc run` runs it: its wall time, and how much of the",
        "step launched kernel by kernel that saves.",
        "",
    ] + table(
        ["attention", "phase", "rows", "context", "launches", "step ms", "GPU events ms", "sum of kernels ms", "overhead ms", "overhead", "CUDA graph step ms", "graph saves"],
        rows,
    )


def folded_kernels(point):
    """The point's nodes with layers folded: summed times, bytes and FLOPs, in first-seen order."""
    groups = {}
    for k in point["kernels"]:
        key = (fold(k["node"]), k["op"])
        g = groups.setdefault(key, {"count": 0, "time_s": 0.0, "bytes": 0.0, "flops": 0.0, "roofline_s": 0.0, "costed": True, "kernels": []})
        g["count"] += 1
        g["time_s"] += k["time_s"]
        for kern in k["kernels"]:
            if kern not in g["kernels"]:
                g["kernels"].append(kern)
        if k.get("roofline_s") is None:
            g["costed"] = False
        else:
            g["bytes"] += k["bytes"]
            g["flops"] += k["flops"]
            g["roofline_s"] += k["roofline_s"]
    return groups


def kernel_rows(point, top):
    groups = folded_kernels(point)
    ordered = sorted(groups.items(), key=lambda kv: -kv[1]["time_s"])[:top]
    rows = []
    for (node, op), g in ordered:
        t = g["time_s"]
        costed = g["costed"] and t > 0
        rows.append(
            [
                f"`{node}`",
                op,
                g["count"],
                ", ".join(g["kernels"]),
                num(t * 1e6),
                num(g["bytes"] / t / 1e9, 0) if costed else DASH,
                num(g["flops"] / t / 1e12, 2) if costed else DASH,
                pct(g["roofline_s"] / t) if costed else DASH,
            ]
        )
    return rows


def kernel_section(docs, top=12):
    """Per kernel for each run's prefill and its decode points at batch 1 and the largest batch,
    at the largest context."""
    out = []
    for d in docs[GLMC]:
        for run in d["runs"]:
            chosen = [("prefill", p) for p in run.get("prefill", [])]
            dec = run.get("decode", [])
            if dec:
                cmax = max(p["context"] for p in dec)
                at = [p for p in dec if p["context"] == cmax]
                for b in sorted({min(p["rows"] for p in at), max(p["rows"] for p in at)}):
                    chosen += [("decode", p) for p in at if p["rows"] == b]
            for phase, p in chosen:
                out += [
                    "",
                    f"### {run['attention']} {phase}, {p['rows']} rows, context {p['context']}: the {top} slowest nodes (layers folded)",
                    "",
                ] + table(
                    ["node", "op", "nodes", "kernels", "time us", "GB/s", "TFLOP/s", "of roofline"],
                    kernel_rows(p, top),
                )
    if out:
        out = ["", "## Per kernel", "", "Mean of the steps timed launch by launch; `of roofline` is the nodes' roofline time over their measured time."] + out
    return out


def peer_section(docs):
    rows = []
    for d in docs[PEER]:
        for m in d["modes"]:
            err = m.get("error") or ""
            rows.append([m["mode"], m["status"], num(m.get("compile_s")), m.get("attn_implementation", DASH), err.replace("|", "\\|")[:200]])
    if not rows:
        return []
    versions = "; ".join(
        f"{d.get('date', '?')}: " + ", ".join(f"{k} {v}" for k, v in d.get("versions", {}).items()) for d in docs[PEER]
    )
    return ["", "## transformers (GlmMoeDsaForCausalLM)", "", versions, ""] + table(
        ["mode", "status", "compile s", "attention implementation", "error"], rows
    )


def matmul_section(docs):
    rows = []
    for d in docs[MATMUL]:
        for s in d["shapes"]:
            ratio = s["glmc_us"] / s["torch_us"] if s.get("torch_us") else None
            rows.append(
                [
                    s["phase"],
                    s["rows"],
                    f"`{s['node']}`",
                    f"{s['heads']} × {s['n']} × {s['k']}",
                    s["dtype"],
                    num(s["glmc_us"]),
                    num(s.get("torch_us")),
                    num(ratio, 2),
                ]
            )
    if not rows:
        return []
    return ["", "## torch.matmul on glmc's GEMM shapes", ""] + table(
        ["phase", "rows", "node (layers folded)", "heads × N × K", "dtype", "glmc us", "torch us", "glmc / torch"], rows
    )


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="markdown file to write (default: stdout)")
    ap.add_argument("--merged", help="also write every input into this one JSON file")
    ap.add_argument("json", nargs="+")
    args = ap.parse_args(argv)
    docs = load(args.json)
    text = render(docs)
    if args.merged:
        with open(args.merged, "w") as f:
            json.dump(merged(docs), f, indent=1)
            f.write("\n")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
