#!/usr/bin/env python3
"""Figures of an `ecokv analyze` result (DIR/analysis.json) as PNGs in DIR, the ECOKV paper's analyses:

  key-cosine.png   pairwise key cosine distribution per layer (Figure 1)
  redundancy.png   r_C, r_E and lambda per layer and KV head (Figures 7-8)
  correlation.png  Spearman correlation of importance and diversity per layer and head (Figures 4 and 6)
  recent-kept.png  selection rate of the last tokens of the prompt under the method (Figure 5)
  kept-map-N.png   image N with the share of (layer, KV head)s keeping each of its tokens, summed and per layer

  python3 scripts/plot-analysis.py DIR        (ecokv analyze runs it unless --no-plots)

Needs matplotlib (scripts/setup.sh --training installs it); exits 3 without it.
"""

import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
except ImportError:
    print("plot-analysis: matplotlib is not installed", file=sys.stderr)
    sys.exit(3)


def save(fig, out, **kw):
    """Through a temporary file, renamed when complete: an interrupted run leaves no half-written PNG."""
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=120, **kw)
    plt.close(fig)
    os.replace(tmp, out)


def per_head(j, key):
    """(layers, KV heads) array of a per-head statistic."""
    n_layers = len(j["layers"])
    a = np.zeros((n_layers, max(h["kv_head"] for h in j["heads"]) + 1))
    for h in j["heads"]:
        a[h["layer"], h["kv_head"]] = h[key]
    return a


def title(j):
    return f"{j['model']}, {j['n_tokens']} tokens; {j['method']} at budget {j['budget']}"


def key_cosine(j, out):
    hist = np.array([layer["cos_hist"] for layer in j["layers"]])
    fig, ax = plt.subplots(figsize=(7, 3.2))
    im = ax.imshow(hist, aspect="auto", origin="lower", extent=(-1, 1, -0.5, len(hist) - 0.5), cmap="viridis")
    ax.plot([layer["pair_cos_mean"] for layer in j["layers"]], range(len(hist)), "w.-", label="mean")
    ax.set_xlabel("cosine similarity of two keys of one head")
    ax.set_ylabel("layer")
    ax.legend(loc="lower left")
    fig.colorbar(im, ax=ax, label="share of key pairs")
    ax.set_title("Key cosine per layer (Figure 1)\n" + title(j), fontsize=8)
    fig.tight_layout()
    save(fig, out)


def redundancy(j, out):
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.2))
    for ax, key, name in zip(axes, ("r_c", "r_e", "lambda"), ("$r_C$", "$r_E$", "$\\lambda$")):
        a = per_head(j, key)
        im = ax.imshow(a, aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=1)
        ax.set_title(name)
        ax.set_xlabel("KV head")
        ax.set_ylabel("layer")
        for (il, ih), v in np.ndenumerate(a):
            ax.text(ih, il, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w" if v < 0.6 else "k")
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.suptitle("Redundancy per layer and head (Figures 7-8); " + title(j), fontsize=8)
    save(fig, out)


def correlation(j, out):
    rho = per_head(j, "spearman")
    fig, ax = plt.subplots(figsize=(6, 3))
    layers = np.arange(len(rho))
    ax.bar(layers, [layer["spearman"] for layer in j["layers"]], color="tab:blue", alpha=0.6, label="layer mean")
    for ih in range(rho.shape[1]):
        ax.plot(layers, rho[:, ih], "o", ms=4, label=f"KV head {ih}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("layer")
    ax.set_ylabel("Spearman(S_imp, S_div)")
    ax.legend(fontsize=7)
    ax.set_title("Importance-diversity correlation (Figures 4, 6)\n" + title(j), fontsize=8)
    fig.tight_layout()
    save(fig, out)


def recent_kept(j, out):
    r = j["recent_kept"]
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.bar(np.arange(len(r)) - len(r), r, color="tab:green")
    ax.set_xlabel("position from the end of the prompt")
    ax.set_ylabel("share of heads keeping it")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Selection rate of the last {len(r)} tokens (Figure 5)\n" + title(j), fontsize=8)
    fig.tight_layout()
    save(fig, out)


def kept_map(j, image, out):
    """The image under a grid of its tokens, each darkened by the share of heads that drop it."""
    first, rows, cols = image["first_cell"], image["rows"], image["cols"]
    maps = [("all layers", j["kept_share"])] + [(f"layer {il}", s) for il, s in enumerate(j["kept_share_by_layer"])]
    try:
        pixels = plt.imread(image["path"])
    except (OSError, ValueError, SyntaxError) as e:
        print(f"plot-analysis: {image['path']}: {e}; kept-token map drawn without the image", file=sys.stderr)
        pixels = np.ones((rows, cols, 3))
    fig, axes = plt.subplots(1, len(maps), figsize=(2.6 * len(maps), 2.6 * rows / cols + 0.8))
    for ax, (name, share) in zip(np.atleast_1d(axes), maps):
        grid = np.array(share[first: first + rows * cols]).reshape(rows, cols)
        ax.imshow(pixels, extent=(0, cols, rows, 0), interpolation="nearest")
        shade = np.zeros((rows, cols, 4))
        shade[..., 0] = 0.6  # dropped tokens turn dark red
        shade[..., 3] = 0.8 * (1.0 - grid)
        ax.imshow(shade, extent=(0, cols, rows, 0), interpolation="nearest")
        ax.set_title(f"{name}: {grid.mean():.0%} kept", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("Kept tokens (clear: kept by every head; dark red: dropped by every head)\n" + title(j), fontsize=8)
    save(fig, out, bbox_inches="tight")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    with open(os.path.join(d, "analysis.json")) as f:
        j = json.load(f)
    written = []
    for name, fn in (("key-cosine", key_cosine), ("redundancy", redundancy), ("correlation", correlation),
                     ("recent-kept", recent_kept)):
        fn(j, os.path.join(d, name + ".png"))
        written.append(name + ".png")
    # One map per image, over the chunk that shows all of it: a tiled image's overview is its last part.
    for i, image in enumerate(j.get("images", [])):
        if image.get("part", 0) + 1 != image.get("n_parts", 1):
            continue
        name = f"kept-map-{image.get('image', i)}.png"
        kept_map(j, image, os.path.join(d, name))
        written.append(name)
    print(f"plots: {', '.join(written)} in {d}")


if __name__ == "__main__":
    main()
