#!/usr/bin/env python3
"""Dynamic-resolution document pages for the Qwen2-VL-style tiny VLM (models/tiny-qwen2vl), drawn so that the
ECOKV paper's premises can be measured on it (issue 14):

- a page is ROWS x COLS cells of 8x8 pixels, ROWS and COLS in 20..24, so Qwen2-VL's projector (4-pixel ViT
  patches, merged 2x2) gives one image token per cell: 400-576 image tokens at the default size;
- every glyph (the 5x7 font) sits at a random offset inside its cell (x 0..3, y 0..1), so its box covers 2x2 ViT
  patches and its strokes fall on different pixels of the patches each time;
- the text (gen_docs's receipts, forms and tables, 16 characters wide) has a random margin and line spacing 1 or
  2, so most cells are background (the page's `background` share is reported by check_pages.py);
- the background is paper with smooth, low-frequency texture (a coarse random field resized bicubically, a
  linear gradient, pixel noise of at most +-2), so neighbouring background cells look alike, as in photographs
  and scans, instead of the per-pixel noise of gen_docs.py;
- `--scale F` (or `scale=` in item()) resizes the finished page with Pillow's bicubic filter to F times its
  cells, rounded to whole 8-pixel cells: the downscaled pages the model also trains on, so that a smaller image is
  a fair baseline.

Item i of `--seed S` uses seed S + i (same seed, same bytes). Seed ranges as gen_docs.py: held-out below
250,000, 250,000-999,999 reserved (never used), training from 1,000,000 (vlm/README.md lists the sets).

Usage: gen_pages.py --seed 0 --count 500 --out DIR [--task qa|read|row|multi] [--scale F] [--all-questions]
writes DIR/images/*.png and DIR/items.jsonl, the `generated` dataset format of `ecokv eval`.
"""

import io
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_docs  # noqa: E402
from gen_docs import ATLAS, CHAR_INDEX, WORDS, NEEDLE_LABELS  # noqa: E402

CELL = 8  # pixels per cell = one image token (2x2 ViT patches of 4 pixels)
MIN_CELLS, MAX_CELLS = 20, 24
WIDTH = 16  # characters per text line


def layout(rng, n_fields, kind=None):
    """A page: (grid, fields, kind, place) with grid ROWS strings of COLS characters; place maps a row/column of
    the compact text (gen_docs's rows) to its cell."""
    kind = kind or rng.choice(list(gen_docs.LAYOUTS))
    rows, fields = gen_docs.LAYOUTS[kind](rng, n_fields, WIDTH)
    n_rows, n_cols = rng.randint(MIN_CELLS, MAX_CELLS), rng.randint(MIN_CELLS, MAX_CELLS)
    rows = rows[: n_rows - 2]
    spacing = 2 if 2 * len(rows) + 1 <= n_rows and rng.random() < 0.5 else 1
    top = rng.randint(1, n_rows - 1 - (spacing * (len(rows) - 1) + 1))
    left = rng.randint(1, n_cols - 1 - WIDTH)
    grid = [[" "] * n_cols for _ in range(n_rows)]
    for r, row in enumerate(rows):
        for c, ch in enumerate(row[:WIDTH]):
            grid[top + spacing * r][left + c] = ch
    kept = [f for f in fields if any(f[1] and f[1] in r for r in rows)]
    return ["".join(g) for g in grid], rows, kept, kind, (lambda r, c: (top + spacing * r, left + c))


def render(grid, rng):
    """RGB uint8 image of a grid: glyphs at random sub-cell offsets over smoothly textured paper."""
    from PIL import Image

    n_rows, n_cols = len(grid), len(grid[0])
    h, w = n_rows * CELL, n_cols * CELL
    ink = np.zeros((h, w), np.float32)
    for r, row in enumerate(grid):
        for c, ch in enumerate(row):
            if ch != " ":
                ox, oy = rng.randint(0, CELL - 5), rng.randint(0, CELL - 7)
                ink[r * CELL + oy: r * CELL + oy + 7, c * CELL + ox: c * CELL + ox + 5] = ATLAS[CHAR_INDEX[ch]]
    nrng = np.random.default_rng(rng.getrandbits(63))
    gh, gw = rng.randint(2, 5), rng.randint(2, 5)
    texture = np.stack([np.asarray(Image.fromarray(nrng.normal(0, 1, (gh, gw)).astype(np.float32), "F")
                                   .resize((w, h), Image.BICUBIC)) for _ in range(3)], -1)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    gradient = (rng.uniform(-20, 20) * xs / w + rng.uniform(-20, 20) * ys / h)[..., None]
    paper = np.array([rng.randint(185, 245) for _ in range(3)], np.float32)
    paper = paper + rng.uniform(6, 16) * texture + gradient
    color = np.array([rng.randint(0, 90) for _ in range(3)], np.float32)
    img = paper + ink[..., None] * (color - paper)
    noise = nrng.integers(-2, 3, img.shape)
    return np.clip(np.rint(img) + noise, 0, 255).astype(np.uint8)


def downscale(img, scale):
    """Pillow bicubic resize to round(scale x cells) whole cells per side (what mtmd's smart resize does to an
    image given fewer tokens than it has, up to its rounding of the size)."""
    from PIL import Image

    h, w = img.shape[0] // CELL, img.shape[1] // CELL
    size = (max(2, round(w * scale)) * CELL, max(2, round(h * scale)) * CELL)
    return np.asarray(Image.fromarray(img).resize(size, Image.BICUBIC))


def questions(grid, rows, fields, place, page_index=0):
    """(question, answer, cells, type) for every question of a page; cells: the (page, row, column) cell of
    each answer character, None for a line break."""
    out = []
    for label, value, q, t in fields:
        cells = gen_docs.answer_cells([rows], q, value)
        out.append((q, value, [None if x is None else (page_index, *place(x[1], x[2])) for x in cells], t))
    lines = [r for r, row in enumerate(rows) if row.strip()]
    for n, r in enumerate(lines):
        c0 = len(rows[r]) - len(rows[r].lstrip())
        text = rows[r].strip()
        out.append((f"Read line {n + 1}.", text, [(page_index, *place(r, c0 + k)) for k in range(len(text))],
                    "read-line"))
    cells, text = [], []
    for r in lines:
        row = rows[r].rstrip()
        cells += ([None] if cells else []) + [(page_index, *place(r, c)) for c in range(len(row))]
        text.append(row)
    out.append(("Read all text.", "\n".join(text), cells, "read-all"))
    return out


def item(seed, task, n_fields=None, scale=None, all_questions=False):
    """One sample: dict(grids, images, question, answer, cells, type, context, others=[(q, a, cells)...]), and
    with all_questions all=[(q, a, type)...], every question of the task on the page in page order (the same
    random draws: the item's question is one of them). A downscaled item (scale < 1) has no cells: its cells no
    longer hold one character each."""
    rng = random.Random(seed)
    if task == "multi":
        return multi_item(rng)
    n = n_fields if n_fields is not None else rng.randint(4, 7)
    grid, rows, fields, _, place = layout(rng, n)
    image = render(grid, rng)
    qs = questions(grid, rows, fields, place)
    pool = {"qa": [x for x in qs if x[3].endswith(("field", "cell"))],
            "row": [x for x in qs if x[3] == "read-line"], "read": [x for x in qs if x[3] == "read-all"]}[task]
    pick = rng.randrange(len(pool))
    q, a, cells, t = pool[pick]
    others = [(x[0], x[1], x[2]) for x in pool[:pick] + pool[pick + 1:]]
    if scale is not None and scale != 1:
        image = downscale(image, scale)
        cells, others = None, [(x[0], x[1], None) for x in others]
    out = {"grids": [grid], "images": [image], "question": q, "answer": a, "cells": cells, "type": t,
           "context": "", "others": others}
    if all_questions:
        out["all"] = [(x[0], x[1], x[3]) for x in pool]
    return out


def multi_item(rng):
    """MileBench-style needle: 2-3 pages and distractor text; one page holds the only NEEDLE field."""
    n_pages = rng.randint(2, 3)
    needle_page = rng.randrange(n_pages)
    label = rng.choice(NEEDLE_LABELS)
    value = str(rng.randint(100, 10 ** (WIDTH - len(label) - 2) - 1))
    grids, images, cells = [], [], None
    for p in range(n_pages):
        grid, rows, _, _, place = layout(rng, rng.randint(3, 5), kind="form" if p == needle_page else None)
        if p == needle_page:
            slots = [i for i, r in enumerate(rows) if not r.strip()] or [len(rows) - 1]
            r = rng.choice(slots)
            line = label + ": " + value
            for c, ch in enumerate(line):
                y, x = place(r, c)
                grid[y] = grid[y][:x] + ch + grid[y][x + 1:]
            cells = [(p, *place(r, len(line) - len(value) + k)) for k in range(len(value))]
        grids.append(grid)
        images.append(render(grid, rng))
    context = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + "."
    return {"grids": grids, "images": images, "question": f"What is the {label}?", "answer": value, "cells": cells,
            "type": "multi-needle", "context": context, "others": []}


def png_bytes(img):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG", optimize=True)
    return buf.getvalue()


def main():
    ap = gen_docs.set_options(__doc__)
    ap.add_argument("--scale", type=float, default=None, help="downscale pages by this factor (0 < F <= 1)")
    ap.add_argument("--all-questions", action="store_true",
                    help="one item per question of the task on each page (ids TASK-SEED-qK), not one chosen question")
    a = ap.parse_args()
    gen_docs.check_seeds(ap, a)
    if a.scale is not None and not 0 < a.scale <= 1:
        ap.error("--scale must be in (0, 1]")
    gen_docs.write_set(a.out, a.seed, a.count, a.task, a.fields, lambda seed, task, n: item(seed, task, n, a.scale, a.all_questions),
                       png_bytes)


if __name__ == "__main__":
    main()
