#!/usr/bin/env python3
"""PNG plots of benchmark JSON files (the inputs render.py takes), with matplotlib.

Usage: plot.py OUT_DIR JSON...

Writes decode-latency.png (decode step latency against context, one line per batch size and
path: glmc dense and sparse, and each transformers mode) and roofline-per-kernel.png (the
fraction of its roofline each node kind reaches, layers folded, at glmc's decode points of
batch 1 and the largest batch at the largest context, and the prefill). matplotlib is on the
H200 test host, not on the CPU machines: scripts/bench-gpu.sh runs this there; CI never does.
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render  # noqa: E402


def decode_latency(docs, path):
    fig, ax = plt.subplots(figsize=(9, 6))
    lines = {}
    for attention, p in render.glmc_points(docs, "decode"):
        lines.setdefault((f"glmc {attention}", p["rows"]), []).append((p["context"], render.decode_latency(p) * 1e3))
    for (mode, batch, context), p in render.peer_decode(docs).items():
        if p.get("step_s"):
            lines.setdefault((f"HF {mode}", batch), []).append((context, p["step_s"]["median"] * 1e3))
    for (label, batch), pts in sorted(lines.items()):
        pts.sort()
        style = "-" if label == "glmc sparse" else "--" if label == "glmc dense" else ":"
        ax.plot([c for c, _ in pts], [t for _, t in pts], style, marker="o", label=f"{label}, batch {batch}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decode step (ms, median)")
    ax.set_title("Decode step latency against context")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def roofline_per_kernel(docs, path, top=16):
    panels = []
    for d in docs[render.GLMC]:
        for run in d["runs"]:
            for p in run.get("prefill", []):
                panels.append((f"{run['attention']} prefill {p['rows']}", p))
            dec = run.get("decode", [])
            if dec:
                cmax = max(p["context"] for p in dec)
                at = [p for p in dec if p["context"] == cmax]
                for b in sorted({min(p["rows"] for p in at), max(p["rows"] for p in at)}):
                    panels += [(f"{run['attention']} decode b={b} t={cmax}", p) for p in at if p["rows"] == b]
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)), squeeze=False)
    for ax, (title, p) in zip(axes[:, 0], panels):
        groups = render.folded_kernels(p)
        rows = sorted(((k, g) for k, g in groups.items() if g["costed"] and g["time_s"] > 0), key=lambda kv: -kv[1]["time_s"])[:top]
        names = [k[0].replace("model.layers.*.", "") for k, _ in rows]
        fractions = [g["roofline_s"] / g["time_s"] for _, g in rows]
        ax.barh(range(len(rows)), fractions)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(names, fontsize=6)
        ax.invert_yaxis()
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("fraction of roofline (the slowest node kinds first)")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    out = sys.argv[1]
    docs = render.load(sys.argv[2:])
    os.makedirs(out, exist_ok=True)
    decode_latency(docs, os.path.join(out, "decode-latency.png"))
    roofline_per_kernel(docs, os.path.join(out, "roofline-per-kernel.png"))
    print(f"wrote plots into {out}")


if __name__ == "__main__":
    main()
