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
  cells, rounded to whole 8-pixel cells: the downscaled pages run qwen2 trained on (without reading targets: their
  `cells` are None);
- `max_tokens=N` or `token_share=F` in item() resizes the page exactly as llama.cpp 0.5.0's mtmd does for
  `--image-max-tokens N` (mtmd_resize: smart resize to the 8-pixel grid with floor(side / beta), Pillow-exact
  bicubic, black PAD_CEIL bars; F: N = floor(F x the page's native tokens)). Such an item keeps its reading
  targets: render() records where it drew each glyph, and each glyph is mapped to the image token (8x8 cell of
  the resized image) that holds the centre of its scaled ink box (token_targets): the answer `cells` become those
  tokens, `token_chars` gives each token's character (one centre in it), " " (no ink) or None (ignored: two or more
  centres, or ink without a centre) and `token_lines` each token row's text line (the grid row whose characters'
  centres it holds, None when none or several), and `token_glyphs` the characters whose centres each token holds,
  in reading order (the glyph-slot targets: a resized token holds 0-4 of them). Native items are unchanged (same
  seed, same bytes and keys);
- `shift=(dy, dx)` in item() (0..7 pixels each) moves the drawn page down and right by that many pixels before any
  resize (shift_image: the paper mirrored in at the top and left, the bottom and right margins cropped, which hold
  no ink), so glyphs straddle token boundaries even at the native size; such an item gets token targets as a
  resized one does (its `shift` recorded), also at the native size.

Item i of `--seed S` uses seed S + i (same seed, same bytes). Seed ranges as gen_docs.py: held-out below
250,000, 250,000-999,999 reserved (never used), training from 1,000,000 (vlm/README.md lists the sets).

Usage: gen_pages.py --seed 0 --count 500 --out DIR [--task qa|read|row|multi] [--scale F] [--all-questions]
writes DIR/images/*.png and DIR/items.jsonl, the `generated` dataset format of `ecokv eval` (which resizes native
pages itself with --image-max-tokens; tests/vlm/test-mtmd-resize.py checks that mtmd_resize does the same).
"""

import io
import math
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_docs  # noqa: E402
from gen_docs import ATLAS, CHAR_INDEX, WORDS, NEEDLE_LABELS  # noqa: E402

CELL = 8  # pixels per cell = one image token (2x2 ViT patches of 4 pixels)
MTMD_MIN_TOKENS = 8  # mtmd's default image_min_tokens for qwen2vl (clip.cpp: set_limit_image_tokens(8, 4096))
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


def render(grid, rng, boxes=None):
    """RGB uint8 image of a grid: glyphs at random sub-cell offsets over smoothly textured paper. A list `boxes`
    gets (row, column, y, x) for every glyph drawn: its cell and the top-left pixel of its 5x7 box (recording them
    draws nothing more from rng)."""
    from PIL import Image

    n_rows, n_cols = len(grid), len(grid[0])
    h, w = n_rows * CELL, n_cols * CELL
    ink = np.zeros((h, w), np.float32)
    for r, row in enumerate(grid):
        for c, ch in enumerate(row):
            if ch != " ":
                ox, oy = rng.randint(0, CELL - 5), rng.randint(0, CELL - 7)
                ink[r * CELL + oy: r * CELL + oy + 7, c * CELL + ox: c * CELL + ox + 5] = ATLAS[CHAR_INDEX[ch]]
                if boxes is not None:
                    boxes.append((r, c, r * CELL + oy, c * CELL + ox))
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


# --- mtmd's resize (llama.cpp 0.5.0, tools/mtmd) -----------------------------------------------------------------
def mtmd_size(width, height, max_tokens, min_tokens=MTMD_MIN_TOKENS, align=CELL):
    """(width, height) mtmd gives an image of width x height pixels with --image-max-tokens max_tokens:
    img_tool::calc_size_preserved_ratio (mtmd-image.cpp) with align = patch 4 x merge 2 and min/max pixels =
    tokens x align^2 (clip.cpp, qwen2vl: set_limit_image_tokens(8, 4096), custom values win), in float32 as there:
    each side rounded to the grid; if that is more than max_pixels, side / beta floored to the grid (beta =
    sqrt(h w / max_pixels)); if less than min_pixels, side x beta ceiled."""
    f32 = np.float32
    a = f32(align)

    def round_by(x):
        return int(math.floor(float(f32(x) / a) + 0.5)) * align  # std::round: halves away from zero (x >= 0)

    def ceil_by(x):
        return int(math.ceil(float(f32(x) / a))) * align

    def floor_by(x):
        return int(math.floor(float(f32(x) / a))) * align

    max_pixels = (max_tokens if max_tokens and max_tokens > 0 else 4096) * align * align
    min_pixels = (min_tokens if min_tokens and min_tokens > 0 else MTMD_MIN_TOKENS) * align * align
    if max_pixels < min_pixels:
        raise ValueError(f"mtmd refuses image_max_tokens {max_tokens} < image_min_tokens {min_tokens}")
    w, h = max(align, round_by(width)), max(align, round_by(height))
    if h * w > max_pixels:
        beta = np.sqrt(f32(f32(height) * f32(width)) / f32(max_pixels), dtype=np.float32)
        h = max(align, floor_by(f32(height) / beta))
        w = max(align, floor_by(f32(width) / beta))
    elif h * w < min_pixels:
        beta = np.sqrt(f32(min_pixels) / f32(f32(height) * f32(width)), dtype=np.float32)
        h = ceil_by(f32(height) * beta)
        w = ceil_by(f32(width) * beta)
    return w, h


def mtmd_geometry(width, height, max_tokens, min_tokens=MTMD_MIN_TOKENS):
    """mtmd's resize of a width x height image: (target width, target height, x offset, y offset, content width,
    content height). img_tool::resize with PAD_CEIL: the content keeps the aspect ratio (scale = the smaller of the
    two float32 ratios, sides ceiled and capped at the target), centred with (target - content) / 2 offsets; the
    rest is black."""
    tw, th = mtmd_size(width, height, max_tokens, min_tokens)
    if (tw, th) == (width, height):
        return tw, th, 0, 0, width, height
    f32 = np.float32
    scale = min(f32(tw) / f32(width), f32(th) / f32(height))
    nw = min(int(math.ceil(float(f32(width) * scale))), tw)
    nh = min(int(math.ceil(float(f32(height) * scale))), th)
    return tw, th, (tw - nw) // 2, (th - nh) // 2, nw, nh


def mtmd_resize(img, max_tokens, min_tokens=MTMD_MIN_TOKENS):
    """The image (H, W, 3 uint8) that mtmd 0.5.0 gives a qwen2vl projector for `--image-max-tokens max_tokens`
    (mtmd_image_preprocessor_dyn_size: mtmd_geometry, then img_tool's resize_pillow, a transcription of Pillow's
    fixed-point bicubic resampling (a = -0.5, 22-bit weights, horizontal pass then vertical), so Pillow's
    Image.resize(BICUBIC) gives the same bytes, into black PAD_CEIL bars). A page already on the 8-pixel grid
    within the budget passes unchanged. tests/vlm/test-mtmd-resize.py checks sizes against `ecokv run` and pixels against
    mtmd's own code."""
    from PIL import Image

    h, w = img.shape[:2]
    tw, th, ox, oy, nw, nh = mtmd_geometry(w, h, max_tokens, min_tokens)
    if (tw, th) == (w, h):
        return img.copy()
    content = np.asarray(Image.fromarray(img).resize((nw, nh), Image.BICUBIC)) if (nw, nh) != (w, h) else img
    out = np.zeros((th, tw, 3), np.uint8)
    out[oy: oy + nh, ox: ox + nw] = content
    return out


def shift_image(img, dy, dx):
    """The page moved down by dy and right by dx pixels (0 <= dy, dx < CELL), the same size: the paper mirrored in at
    the top and left (np.pad's reflect, so the texture continues), the bottom and right margins cropped. layout()
    leaves at least one blank cell below and right of the text, and a glyph's 5x7 box ends inside its 8x8 cell, so
    no ink is cropped."""
    if not (0 <= dy < CELL and 0 <= dx < CELL):
        raise ValueError(f"shift ({dy}, {dx}): each 0..{CELL - 1} pixels")
    h, w = img.shape[:2]
    return np.pad(img, ((dy, 0), (dx, 0), (0, 0)), mode="reflect")[:h, :w]


def _ink_extents():
    """Per character index, the (y0, y1, x0, x1) end-exclusive box of its glyph's ink inside the 5x7 box."""
    out = {}
    for i, glyph in enumerate(ATLAS):
        ys, xs = np.nonzero(glyph)
        if len(ys):
            out[i] = (int(ys.min()), int(ys.max()) + 1, int(xs.min()), int(xs.max()) + 1)
    return out


INK_EXTENTS = _ink_extents()


def token_targets(grid, boxes, geometry, shift=(0, 0)):
    """Reading targets of a page resized as geometry (mtmd_geometry's tuple for its size) says, its drawing moved by
    shift = (dy, dx) pixels first (shift_image; render()'s boxes are those of the unmoved page).

    Each glyph (boxes: render()'s) has a scaled ink box (source pixel u lands at offset + u x content / source) and
    its centre lies in one image token (8x8 cell of the resized image); a cell without a glyph (a space) uses its
    own centre. Returns (token_chars, token_lines, where, token_glyphs):
    - token_chars: rows x columns of the resized token grid, each the character whose centre is the only one in the
      token, " " where no ink box reaches it, None (ignored) where two or more centres lie or ink without a centre;
    - token_lines: per token row, the grid row whose text characters' centres are the only ones in it, else None;
    - where: {(row, column) of the grid: (token row, token column)}, every cell of the grid;
    - token_glyphs: rows x columns of the resized token grid, each the string of the characters whose centres lie
      in the token, in reading order (grid row, then column); "" where none does.
    At the native size (no resize) token_chars is the grid, token_lines its rows and where the identity."""
    tw, th, ox, oy, nw, nh = geometry
    n_rows, n_cols = len(grid), len(grid[0])
    sx, sy = nw / (n_cols * CELL), nh / (n_rows * CELL)
    rows, cols = th // CELL, tw // CELL
    dy, dx = shift

    def token(y, x):
        return min(rows - 1, max(0, int(math.floor(y / CELL)))), min(cols - 1, max(0, int(math.floor(x / CELL))))

    where = {(r, c): token(oy + ((r + 0.5) * CELL + dy) * sy, ox + ((c + 0.5) * CELL + dx) * sx)
             for r in range(n_rows) for c in range(n_cols)}
    centres = {}  # token -> [grid cells whose glyph centre lies in it]
    inked = set()  # tokens that some glyph's ink box reaches
    for r, c, y, x in boxes:
        y, x = y + dy, x + dx
        y0, y1, x0, x1 = INK_EXTENTS[CHAR_INDEX[grid[r][c]]]
        top, bottom = oy + (y + y0) * sy, oy + (y + y1) * sy
        left, right = ox + (x + x0) * sx, ox + (x + x1) * sx
        where[r, c] = token((top + bottom) / 2, (left + right) / 2)
        centres.setdefault(where[r, c], []).append((r, c))
        for tr in range(int(math.floor(top / CELL)), int(math.ceil(bottom / CELL))):
            for tc in range(int(math.floor(left / CELL)), int(math.ceil(right / CELL))):
                inked.add((tr, tc))
    chars = [[None if (tr, tc) in centres and len(centres[tr, tc]) > 1 else
              grid[centres[tr, tc][0][0]][centres[tr, tc][0][1]] if (tr, tc) in centres else
              None if (tr, tc) in inked else " " for tc in range(cols)] for tr in range(rows)]
    lines = []
    for tr in range(rows):
        held = {r for tc in range(cols) for r, _ in centres.get((tr, tc), ())}
        lines.append(held.pop() if len(held) == 1 else None)
    glyphs = [["".join(grid[r][c] for r, c in sorted(centres.get((tr, tc), ()))) for tc in range(cols)]
              for tr in range(rows)]
    return chars, lines, where, glyphs


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


def item(seed, task, n_fields=None, scale=None, all_questions=False, max_tokens=None, token_share=None, shift=None):
    """One sample: dict(grids, images, question, answer, cells, type, context, others=[(q, a, cells)...]), and
    with all_questions all=[(q, a, type)...], every question of the task on the page in page order (the same
    random draws: the item's question is one of them). A downscaled item (scale < 1) has no cells: its cells no
    longer hold one character each.
    max_tokens=N (or token_share=F: N = max(8, floor(F x the page's native tokens))) resizes a single page as mtmd
    does for --image-max-tokens N (mtmd_resize) and keeps its reading targets: the answer cells become the image
    tokens holding the characters' centres, and the item gains token_chars, token_lines, token_glyphs (per image,
    token_targets')
    and max_tokens. The page and questions are drawn first, so they are those of the native item.
    shift=(dy, dx) (pixels, 0..7 each) moves the drawn page first (shift_image), with or without a resize; a shifted
    item has token targets as a resized one (max_tokens None at the native size) and `shift`. (0, 0) or None: none."""
    rng = random.Random(seed)
    if task == "multi":
        return multi_item(rng)
    n = n_fields if n_fields is not None else rng.randint(4, 7)
    grid, rows, fields, _, place = layout(rng, n)
    boxes = []
    image = render(grid, rng, boxes)
    qs = questions(grid, rows, fields, place)
    pool = {"qa": [x for x in qs if x[3].endswith(("field", "cell"))],
            "row": [x for x in qs if x[3] == "read-line"], "read": [x for x in qs if x[3] == "read-all"]}[task]
    pick = rng.randrange(len(pool))
    q, a, cells, t = pool[pick]
    others = [(x[0], x[1], x[2]) for x in pool[:pick] + pool[pick + 1:]]
    extra = {}
    if token_share is not None and max_tokens is None:
        max_tokens = max(MTMD_MIN_TOKENS, int(token_share * len(grid) * len(grid[0])))
    shift = tuple(shift) if shift is not None and tuple(shift) != (0, 0) else None
    if shift is not None:
        image = shift_image(image, *shift)
    if max_tokens is not None or shift is not None:
        h, w = image.shape[:2]
        geometry = mtmd_geometry(w, h, max_tokens) if max_tokens is not None else (w, h, 0, 0, w, h)
        if max_tokens is not None:
            image = mtmd_resize(image, max_tokens)
        chars, lines, where, glyphs = token_targets(grid, boxes, geometry, shift or (0, 0))

        def moved(cs):
            return [None if x is None else (x[0], *where[x[1], x[2]]) for x in cs]

        cells, others = moved(cells), [(x[0], x[1], moved(x[2])) for x in others]
        extra = {"token_chars": [chars], "token_lines": [lines], "token_glyphs": [glyphs], "max_tokens": max_tokens}
        if shift is not None:
            extra["shift"] = shift
    elif scale is not None and scale != 1:
        image = downscale(image, scale)
        cells, others = None, [(x[0], x[1], None) for x in others]
    out = {"grids": [grid], "images": [image], "question": q, "answer": a, "cells": cells, "type": t,
           "context": "", "others": others, **extra}
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
    a = ap.parse_args()
    gen_docs.check_seeds(ap, a)
    if a.scale is not None and not 0 < a.scale <= 1:
        ap.error("--scale must be in (0, 1]")
    gen_docs.write_set(a.out, a.seed, a.count, a.task, a.fields, lambda seed, task, n: item(seed, task, n, a.scale, a.all_questions),
                       png_bytes)


if __name__ == "__main__":
    main()
