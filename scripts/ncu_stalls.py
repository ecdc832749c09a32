#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's source page.

    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SASS.csv
    python3 scripts/ncu_stalls.py SASS.csv [TOP]      # or SASS.csv.gz, as tests/gpu/results keeps them

Prints the warp-state samples of the whole kernel by stall reason, then the TOP (default 25)
instructions with the most samples, each with its two largest reasons, then the instructions that
read or write more L2 sectors, or take more shared-memory wavefronts, than their accesses need
(ncu's "excessive" sectors and wavefronts).
"""
import collections
import csv
import gzip
import sys


def main(path, top=25):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel; row 1 is the header.
    header, data = rows[1], rows[2:]
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def n(row, name):
        v = row[col[name]]
        return int(v) if v.strip().lstrip("-").isdigit() else 0

    samples = "Warp Stall Sampling (All Samples)"
    total = sum(n(r, samples) for r in data)
    by_reason = collections.Counter({h: sum(n(r, h) for r in data) for h in reasons})
    print(f"{rows[0][1]}: {total} samples")
    for h, v in by_reason.most_common():
        if v:
            print(f"  {h:24s} {v:7d} {100 * v / total:5.1f}%")
    print(f"the {top} instructions with the most samples:")
    for r in sorted(data, key=lambda r: -n(r, samples))[:top]:
        s = n(r, samples)
        two = sorted(((n(r, h), h) for h in reasons), reverse=True)[:2]
        why = ", ".join(f"{h} {v}" for v, h in two if v)
        print(f"  {r[0][-5:]} {s:6d} {100 * s / total:5.1f}%  {r[1].strip()[:56]:56s} {why}")
    for what, of in [("L2 sectors", "L2 Theoretical Sectors Global"), ("shared wavefronts", "L1 Wavefronts Shared")]:
        excess = of + " Excessive"
        if excess not in col:
            continue
        print(f"excessive {what}: {sum(n(r, excess) for r in data)} of {sum(n(r, of) for r in data)}")
        for r in sorted(data, key=lambda r: -n(r, excess))[:top]:
            if n(r, excess):
                print(f"  {r[0][-5:]} {n(r, excess):8d} of {n(r, of):8d}  {r[1].strip()[:56]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
