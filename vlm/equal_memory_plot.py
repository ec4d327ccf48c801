#!/usr/bin/env python3
"""Accuracy against KV entries per head, eviction beside a smaller image (vlm/equal_memory.sh's runs).

  python3 vlm/equal_memory_plot.py OUT

Reads OUT/{agnostic,prompt}-*/results.jsonl (ecokv eval's records) and writes OUT/equal-memory.md (a table per
protocol: exact match x100 with its standard error, and the KV entries per head each cell holds), .csv (one row
per series and point) and .png (one panel per protocol, a curve per series), and beside each score table the mean
prefill time (ms): what a smaller image saves besides memory, and eviction does not. A compressed cache holds its budget in
every KV head (window included; the uniform and SparseMM allocators keep a mean of B per head); the full cache of a
smaller image holds its whole prompt, the mean of the records' prompt_tokens.
"""

import csv
import glob
import json
import math
import os
import sys

SMALLER = "full cache, smaller image"
BOTH = "smaller image + snapkv+ecokv"


def series_points(out, mode):
    """{series: {budget column: (entries per head, score x100, standard error, n, mean prefill ms)}}."""
    groups = {}
    for path in sorted(glob.glob(os.path.join(out, f"{mode}-*", "results.jsonl"))):
        run = os.path.basename(os.path.dirname(path))[len(mode) + 1:]
        for line in open(path):
            r = json.loads(line)
            if r.get("score") is None:
                continue
            if run.startswith("image-"):
                name, column = SMALLER, int(run.split("-")[1])
            elif run.startswith("both-"):
                name, column = BOTH, r["budget"]
            elif r["method"] == "full":
                name, column = "full cache, native page", 0
            else:
                name, column = r["method"], r["budget"]
            g = groups.setdefault(name, {}).setdefault(column, {"scores": [], "entries": [], "prefill": []})
            g["prefill"].append(1000.0 * r.get("prefill_s", math.nan))
            g["scores"].append(100.0 * r["score"])
            g["entries"].append(r["prompt_tokens"] if name.startswith("full") else r["budget"])
    points = {}
    for name, columns in groups.items():
        for column, g in columns.items():
            n = len(g["scores"])
            mean = sum(g["scores"]) / n
            sd = math.sqrt(sum((s - mean) ** 2 for s in g["scores"]) / (n - 1)) if n > 1 else 0.0
            points.setdefault(name, {})[column] = (sum(g["entries"]) / n, mean, sd / math.sqrt(n), n,
                                                   sum(g["prefill"]) / n)
    return points


def write_table(md, mode, points):
    columns = sorted({c for p in points.values() for c in p if c > 0})
    md.append(f"### {mode} protocol\n")
    order = sorted(points, key=lambda s: (not s.startswith("full"), s == BOTH, s))
    head = ["| series | " + " | ".join(f"B = {c}" for c in columns) + " | native |", "|---|" + "---:|" * (len(columns) + 1)]
    md.extend(head)
    prefill = [f"Prefill of the prompt, ms (mean over items), {mode} protocol:\n"] + head
    for name in order:
        cells, times = [], []
        for c in columns + [0]:
            if c in points[name]:
                entries, score, se, _, ms = points[name][c]
                cells.append(f"{score:.1f} ±{se:.1f} ({entries:.0f})")
                times.append(f"{ms:.1f}")
            else:
                cells.append("-")
                times.append("-")
        md.append(f"| {name} | " + " | ".join(cells) + " |")
        prefill.append(f"| {name} | " + " | ".join(times) + " |")
    md.append("")
    md.extend(prefill + [""])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    modes = [m for m in ("agnostic", "prompt") if glob.glob(os.path.join(out, f"{m}-*", "results.jsonl"))]
    if not modes:
        sys.exit(f"{out}: no {{agnostic,prompt}}-*/results.jsonl")
    md = ["Exact match x100 ± standard error (KV entries per head, mean over items); B: the budget, or the "
          "smaller image's --image-max-tokens.\n"]
    rows = []
    data = {}
    for mode in modes:
        data[mode] = series_points(out, mode)
        write_table(md, mode, data[mode])
        for name, p in data[mode].items():
            for column, (entries, score, se, n, ms) in sorted(p.items()):
                rows.append([mode, name, column, f"{entries:.1f}", f"{score:.2f}", f"{se:.2f}", n, f"{ms:.2f}"])

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes) + 2.5, 4), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for name, p in sorted(data[mode].items()):
            if name == "full cache, native page":
                continue
            xs = sorted(p.values())
            if name == SMALLER and 0 in data[mode].get("full cache, native page", {}):
                xs.append(data[mode]["full cache, native page"][0])  # the native page ends the curve
            style = "k-o" if name == SMALLER else ("k--s" if name == BOTH else "-^")
            ax.errorbar([x[0] for x in xs], [x[1] for x in xs], yerr=[x[2] for x in xs], fmt=style, label=name,
                        capsize=2, linewidth=2 if name in (SMALLER, BOTH) else 1)
        ax.set_xlabel("KV entries per head")
        ax.set_ylabel("exact match (%)")
        ax.set_ylim(0, 100)
        ax.set_title(f"tiny-qwen2vl, {mode} protocol")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))  # beside the panels: none is empty
    fig.tight_layout()
    files = {"equal-memory.md": "\n".join(md) + "\n"}
    tmp_png = os.path.join(out, "equal-memory.png.tmp.png")
    fig.savefig(tmp_png, dpi=110)
    for name, text in files.items():
        tmp = os.path.join(out, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out, name))
    tmp = os.path.join(out, "equal-memory.csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["protocol", "series", "budget", "kv_entries_per_head", "score", "se", "n", "prefill_ms"])
        w.writerows(rows)
    os.replace(tmp, os.path.join(out, "equal-memory.csv"))
    os.replace(tmp_png, os.path.join(out, "equal-memory.png"))
    print("\n".join(md))


if __name__ == "__main__":
    main()
