#!/usr/bin/env python3
"""Plots engram-model-step's JSON output (--json): per shape, each method's step-time overhead
against the tables in GPU memory (p50 and p99), and the timeline of one step (the lookup on its
side stream against layers 0-2 on the main stream).

    python3 bench/model/plot_model_step.py bench/results/model-step-h200.json \
        bench/results/model-step-h200.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TARGETS = {"resident inplace": 3.0, "cache half": 10.0, "cache inplace": 10.0}


def overhead_panel(ax, shape):
    methods = [m for m in shape["methods"] if m["name"] not in ("no engram", "gpu memory")]
    names = [m["name"] for m in methods]
    p50 = [100 * (m["vs_gpu_memory"] - 1) for m in methods]
    p99 = [100 * (m["vs_gpu_memory_p99"] - 1) for m in methods]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], p50, width=0.4, label="p50")
    ax.bar([i + 0.2 for i in x], p99, width=0.4, label="p99")
    for i, (a, b) in enumerate(zip(p50, p99)):
        ax.annotate(f"{a:+.1f}%", (i - 0.2, a), ha="center", va="bottom", fontsize=7)
        ax.annotate(f"{b:+.1f}%", (i + 0.2, b), ha="center", va="bottom", fontsize=7)
    for i, name in enumerate(names):
        if name in TARGETS and shape["name"] == "decode":
            ax.hlines(TARGETS[name], i - 0.45, i + 0.45, colors="red", linestyles="dashed")
        if name == "resident inplace" and shape["name"] == "prefill":
            ax.hlines(3.0, i - 0.45, i + 0.45, colors="red", linestyles="dashed")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_yscale("symlog", linthresh=5)  # a slow tier must not flatten the others to zero
    ax.set_ylim(bottom=-1)
    ax.set_ylabel("step time vs tables in GPU memory (%, log above 5)")
    gpu = next(m for m in shape["methods"] if m["name"] == "gpu memory")
    ax.set_title(f"{shape['name']}: {shape['tokens']} tokens, GPU-memory step "
                 f"{gpu['p50_us'] / 1000:.2f} ms p50 (red: target)", fontsize=9)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.legend(fontsize=8)


def timeline_panel(ax, shape):
    methods = [m for m in shape["methods"] if m["name"] != "no engram"]
    for row, m in enumerate(methods):
        t = m["timeline_us"]
        ax.barh(row + 0.18, t["layer 0 end"], left=0, height=0.3, color="#999999")
        ax.barh(row + 0.18, t["layer 1 end"] - t["layer 0 end"], left=t["layer 0 end"],
                height=0.3, color="#4477aa")
        ax.barh(row + 0.18, t["layer 2 end"] - t["layer 1 end"], left=t["layer 1 end"],
                height=0.3, color="#999999")
        ax.barh(row - 0.18, t["layer-1 rows ready"] - t["lookup start"], left=t["lookup start"],
                height=0.3, color="#ee6677")
        ax.barh(row - 0.18, t["layer-14 rows ready"] - t["layer-1 rows ready"],
                left=t["layer-1 rows ready"], height=0.3, color="#ffbb99")
        ax.plot([t["layer-1 Engram starts"]] * 2, [row + 0.03, row + 0.33], color="black")
    # The axis ends past the second-latest layer 2: a much slower method runs off the edge,
    # its end written beside it.
    ends = sorted(max(m["timeline_us"]["layer 2 end"], m["timeline_us"]["layer-14 rows ready"])
                  for m in methods)
    limit = 1.15 * (ends[-2] if len(ends) > 1 else ends[-1])
    ax.set_xlim(0, limit)
    for row, m in enumerate(methods):
        t = m["timeline_us"]
        end = max(t["layer 2 end"], t["layer-14 rows ready"])
        if end > limit:
            ax.annotate(f"layer-1 rows at {t['layer-1 rows ready'] / 1000:.1f} ms, layer 2 ends "
                        f"at {t['layer 2 end'] / 1000:.1f} ms", (0.02 * limit, row),
                        fontsize=7, va="center", color="black",
                        bbox=dict(facecolor="white", alpha=0.8, linewidth=0))
    ax.set_yticks(range(len(methods)))
    ax.set_yticklabels([m["name"] for m in methods], fontsize=8)
    ax.set_xlabel("us after the step starts (GPU clock, median)")
    ax.set_title("upper: layers 0 (grey), 1 (blue, with Engram), 2 (grey); black tick: layer-1 "
                 "Engram starts\nlower: lookup to layer-1 rows (red), then layer-14 rows (orange)",
                 fontsize=8)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_model_step.py RESULTS.json OUT.png")
    with open(sys.argv[1]) as f:
        data = json.load(f)
    shapes = data["shapes"]
    fig, axes = plt.subplots(len(shapes), 2, figsize=(14, 4.5 * len(shapes)), squeeze=False)
    for row, shape in enumerate(shapes):
        overhead_panel(axes[row][0], shape)
        timeline_panel(axes[row][1], shape)
    fig.suptitle(f"engram-model-step on {data['device']} ({data['tokens']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
