#!/usr/bin/env python3
"""Plot a training run's learning curve (RUN/log.csv from vlm/train.py or train_qwen2vl.py) to a PNG; a
log with an eval_exact_resized column (train_qwen2vl.py --watch-resize) gets that curve too.

  python3 vlm/plot_curve.py vlm/runs/main/log.csv models/tiny-vlm-curve.png
"""

import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = list(csv.DictReader(open(sys.argv[1])))
    if not rows:
        sys.exit(f"{sys.argv[1]}: no rows")
    step = [int(r["step"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(step, [float(r["loss"]) for r in rows], "o-", label="answer loss (nats/token)")
    if "glyph_loss" in rows[0]:
        ax.plot(step, [float(r["glyph_loss"]) for r in rows], "s-", label="glyph loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot(step, [100 * float(r["eval_exact"]) for r in rows], "k^-", label="held-out exact match (%)")
    if rows[0].get("eval_exact_resized"):  # train_qwen2vl.py --watch-resize: the watch set resized by mtmd
        ax2.plot(step, [100 * float(r["eval_exact_resized"]) for r in rows], "kv--", label="resized pages (%)")
    ax2.set_ylabel("exact match (%)")
    ax2.set_ylim(0, 100)
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [l.get_label() for l in lines], loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3,
              fontsize=8, frameon=False)
    run = os.path.basename(os.path.dirname(os.path.abspath(sys.argv[1])))
    ax.set_title(f"run {run}: learning curve (exact match on the 128-item held-out watch set)")
    fig.tight_layout()
    tmp = sys.argv[2] + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, sys.argv[2])


if __name__ == "__main__":
    main()
