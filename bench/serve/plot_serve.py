#!/usr/bin/env python3
"""Plots engram-serve's JSON output (--json): per load point, each method's p99 time to first
token, p99 time per output token and p99.9 inter-token gap against the tables in GPU memory's,
and its stutters. One file, or one per platform side by side:

    python3 bench/serve/plot_serve.py serve-h200.json [serve-gb10.json] serve.png
"""
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [("ttft_p99_ms", "TTFT p99 (ms)"), ("tpot_p99_ms", "TPOT p99 (ms)"),
          ("itl_p999_ms", "inter-token gap p99.9 (ms)"), ("stutters", "stutters (gap > 2x median)")]


def by_method(points):
    methods = {}
    for p in points:
        methods.setdefault(p["method"], []).append(p)
    return methods


def value(p, key):
    v = p.get(key)
    return math.nan if v is None or p.get("error") else v


def panel(ax, data, key, label):
    points = data.get("points", [])
    loads = list(dict.fromkeys(p["load"] for p in points))
    methods = by_method(points)
    width = 0.8 / max(1, len(methods))
    for i, (name, ps) in enumerate(methods.items()):
        at = {p["load"]: value(p, key) for p in ps}
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(loads))]
        ys = [at.get(load, math.nan) for load in loads]
        style = dict(color="black") if name == "gpu memory" else {}
        ax.bar(xs, ys, width=width, label=name, **style)
    ax.set_xticks(range(len(loads)))
    ax.set_xticklabels(loads)
    ax.set_xlabel("load point (cN: N clients; rX: X requests/s)")
    ax.set_ylabel(label)
    if key != "stutters":
        ax.set_yscale("log")  # a slow tier must not flatten the others
    ax.set_title(f"{data.get('platform', '?')}: {label}", fontsize=9)


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: plot_serve.py RESULTS.json [MORE.json ...] OUT.png")
    runs = []
    for path in sys.argv[1:-1]:
        with open(path) as f:
            runs.append(json.load(f))
    fig, axes = plt.subplots(len(runs), len(PANELS), figsize=(5 * len(PANELS), 4.2 * len(runs)),
                             squeeze=False)
    for row, data in enumerate(runs):
        for col, (key, label) in enumerate(PANELS):
            panel(axes[row][col], data, key, label)
        axes[row][0].legend(fontsize=7)
    devices = ", ".join(f"{d.get('platform')} on {d.get('device')}" for d in runs)
    fig.suptitle(f"engram-serve: {devices} (black: tables in GPU memory, the ideal)", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[-1], dpi=110)


if __name__ == "__main__":
    main()
