#!/usr/bin/python3
"""Plots engram-bench results: microseconds per row against the resident fraction of the batch's
rows, one line per method, one panel per (layout, batch size, id distribution).

Usage: plot_gather.py results.csv out.png
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = list(csv.DictReader(open(argv[1])))
    if not rows:
        print(f"{argv[1]} has no results", file=sys.stderr)
        return 1
    panels = sorted({(r["layout"], int(r["batch"]), r["dist"]) for r in rows},
                    key=lambda p: (p[2], p[0], p[1]))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cols = 4 if len(panels) >= 4 else len(panels)
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows), squeeze=False)
    for ax, (layout, batch, dist) in zip(axes.flat, panels):
        series = defaultdict(list)
        for r in rows:
            if (r["layout"], int(r["batch"]), r["dist"]) == (layout, batch, dist):
                series[r["method"]].append((float(r["resident"]), float(r["us_per_row"])))
        for m in methods:
            pts = sorted(series.get(m, []))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
        ax.set_yscale("log")
        ax.set_title(f"{layout}, {batch:,} rows, {dist}", fontsize=9)
        ax.set_xlabel("resident fraction of the batch's rows")
        ax.set_ylabel("µs per row (wall)")
        ax.set_xticks([0, 0.5, 1])
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
