#!/usr/bin/env python3
"""How legible a glyph stays when mtmd resizes a page (issue 33): an upper bound on reading, whatever the model.

    python3 vlm/legibility.py [--pages 40] [--glyphs 5] [--seed 231000] [--noise 2]

For held-out pages (seeds SEED.., below 250,000) and a few glyphs on each, an oracle that knows everything but the
glyph's character (the page, every other glyph, the texture, the offsets) names it from the resized page: it renders
the page once per candidate character, resizes each as mtmd does for --image-max-tokens N (gen_pages.mtmd_resize,
N = floor(share x native tokens)), and picks the candidate nearest (L2, over the glyph's scaled box and 2 pixels
around it) to the observed page, which is the true page with fresh uniform pixel noise of +-NOISE (2: the generator's own
level; larger: how much margin the glyphs keep) added before the resize. Where the oracle fails, the pixels do not hold the character; where it succeeds
and the model fails, the model is what reads too little.
"""

import argparse
import math
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_pages  # noqa: E402
from gen_docs import CHAR_INDEX  # noqa: E402

SHARES = (1.0, 0.9, 0.75, 0.6, 0.5, 0.35, 0.25, 0.2, 0.1)
CANDIDATES = sorted(c for c in CHAR_INDEX if c.strip() and len(c) == 1)


def page(seed, swap=None):
    """The held-out page of `seed` (its grid, image and glyph boxes), with the character at swap = (row, col, ch)
    replaced: the same random draws, so only that glyph changes."""
    rng = random.Random(seed)
    grid, *_ = gen_pages.layout(rng, rng.randint(4, 7))
    if swap is not None:
        r, c, ch = swap
        grid = [row[:c] + ch + row[c + 1:] if i == r else row for i, row in enumerate(grid)]
    boxes = []
    return grid, gen_pages.render(grid, rng, boxes), boxes


def window(geometry, native_hw, box):
    """The glyph's 5x7 box (native pixels) in the resized image, widened by 2 pixels: (y0, y1, x0, x1)."""
    tw, th, ox, oy, nw, nh = geometry
    sy, sx = nh / native_hw[0], nw / native_hw[1]
    y, x = box
    return (max(0, math.floor(oy + y * sy) - 2), min(th, math.ceil(oy + (y + 7) * sy) + 2),
            max(0, math.floor(ox + x * sx) - 2), min(tw, math.ceil(ox + (x + 5) * sx) + 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--glyphs", type=int, default=5, help="glyphs per page")
    ap.add_argument("--seed", type=int, default=231_000)
    ap.add_argument("--noise", type=int, default=2, help="the observed page's extra pixel noise, +-NOISE")
    a = ap.parse_args()
    if a.pages < 1 or a.glyphs < 1 or a.noise < 0:
        ap.error("--pages and --glyphs must be at least 1, --noise at least 0")
    if a.seed < 0 or a.seed + a.pages > 250_000:
        ap.error("held-out seeds only (below 250,000): --seed + --pages must not pass it")
    right = {s: 0 for s in SHARES}
    total = 0
    for seed in range(a.seed, a.seed + a.pages):
        grid, img, boxes = page(seed)
        h, w = img.shape[:2]
        tokens = (h // gen_pages.CELL) * (w // gen_pages.CELL)
        picks = np.random.default_rng(seed).choice(len(boxes), min(a.glyphs, len(boxes)), replace=False)
        noise = np.random.default_rng(seed + 1).integers(-a.noise, a.noise + 1, img.shape)
        observed = np.clip(img.astype(np.int32) + noise, 0, 255).astype(np.uint8)
        for k in picks:
            r, c, y, x = boxes[k]
            truth = grid[r][c]
            pages = {ch: page(seed, (r, c, ch))[1] for ch in CANDIDATES}
            total += 1
            for share in SHARES:
                n = max(gen_pages.MTMD_MIN_TOKENS, int(share * tokens))
                y0, y1, x0, x1 = window(gen_pages.mtmd_geometry(w, h, n), (h, w), (y, x))
                seen = gen_pages.mtmd_resize(observed, n)[y0:y1, x0:x1].astype(np.float32)
                dist = {ch: float(((gen_pages.mtmd_resize(p, n)[y0:y1, x0:x1] - seen) ** 2).sum())
                        for ch, p in pages.items()}
                right[share] += min(dist, key=dist.get) == truth
        print(f"\r{seed - a.seed + 1}/{a.pages} pages", end="", file=sys.stderr)
    print(file=sys.stderr)
    print(f"{total} glyphs on {a.pages} held-out pages (seeds {a.seed}..{a.seed + a.pages - 1}), "
          f"{len(CANDIDATES)} candidate characters, observed with pixel noise +-{a.noise}")
    print("| share of native tokens | " + " | ".join(f"{s:g}" for s in SHARES) + " |")
    print("|---|" + "---:|" * len(SHARES))
    print("| linear size | " + " | ".join(f"{math.sqrt(s):.2f}" for s in SHARES) + " |")
    print("| oracle names the glyph | " + " | ".join(f"{100 * right[s] / total:.1f}%" for s in SHARES) + " |")


if __name__ == "__main__":
    main()
