#!/usr/bin/env python3
"""The page generator of tiny-qwen2vl (vlm/gen_pages.py): same seed, same bytes; pages of 20..24 x 20..24 cells of
8 pixels; ink only in the cells that hold a character (every glyph cell has a pixel at ink darkness, no background
cell has one); each answer character's cell holds that character; most cells are background; downscaled pages
have whole cells; reserved seeds are refused; a page moved off the token grid (item's shift) is the same page a few
pixels down and right with no ink lost, and its reading targets are those computed here from its pixels. Usage:
test-gen-pages.py REPO_ROOT"""

import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = sys.argv[1]
GEN = os.path.join(ROOT, "vlm", "gen_pages.py")
from checks import check, finish  # noqa: E402  (tests/vlm/checks.py)
sys.path.insert(0, os.path.join(ROOT, "vlm"))
import gen_pages  # noqa: E402

INK_MAX = 92  # ink colours are 0..90, plus pixel noise of at most 2
def files(d):
    out = {}
    for base, _, names in os.walk(d):
        for n in names:
            p = os.path.join(base, n)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


with tempfile.TemporaryDirectory() as tmp:
    runs = []
    for k, seed in enumerate((11, 11, 12)):
        out = os.path.join(tmp, str(k))
        subprocess.run([sys.executable, GEN, "--seed", str(seed), "--count", "3", "--task", "qa", "--out", out],
                       check=True, capture_output=True)
        runs.append(files(out))
    check(runs[0] == runs[1], "same seed, same bytes (images and items.jsonl)")
    check(runs[0] != runs[2], "another seed, other bytes")
    r = subprocess.run([sys.executable, GEN, "--seed", "249999", "--count", "2", "--out", tmp], capture_output=True,
                       text=True)
    check(r.returncode != 0 and "reserved" in r.stderr, "seeds 250,000-999,999 are refused")

bad_ink, bad_cells, sizes, background, n_answers = [], [], [], [], 0
for seed in range(40):
    for task in ("qa", "row", "read", "multi"):
        it = gen_pages.item(seed, task)
        for grid, img in zip(it["grids"], it["images"]):
            rows, cols = len(grid), len(grid[0])
            sizes.append(20 <= rows <= 24 and 20 <= cols <= 24 and img.shape == (rows * 8, cols * 8, 3))
            darkest = img.reshape(rows, 8, cols, 8, 3).min(axis=(1, 3, 4))
            glyph = np.array([[ch != " " for ch in line] for line in grid])
            if not (np.all(darkest[glyph] <= INK_MAX) and np.all(darkest[~glyph] > INK_MAX)):
                bad_ink.append((seed, task))
            background.append(1 - glyph.mean())
        cells = it["cells"]
        for k, ch in enumerate(it["answer"]):
            if cells[k] is None:
                continue
            page, r, c = cells[k]
            n_answers += 1
            if it["grids"][page][r][c] != ch:
                bad_cells.append((seed, task, k))
check(all(sizes), "pages of 20..24 x 20..24 cells, 8 pixels each (400-576 image tokens)")
check(not bad_ink, f"ink exactly in the cells that hold a character (pages failing: {bad_ink[:3]})")
check(not bad_cells and n_answers > 1000, f"each of {n_answers} answer characters' cells holds it ({bad_cells[:3]})")
check(np.mean(background) >= 0.7, f"background share {np.mean(background):.2f} >= 0.70")

small = gen_pages.item(5, "qa", scale=0.6)
grid = gen_pages.item(5, "qa")["grids"][0]
want = (round(len(grid) * 0.6) * 8, round(len(grid[0]) * 0.6) * 8, 3)
check(small["images"][0].shape == want and small["cells"] is None,
      f"a page downscaled by 0.6 has whole cells {small['images'][0].shape} == {want}, and no cells")

# A page moved off the token grid by (dy, dx) pixels (item's shift, tiny-qwen2vl v3). The glyphs' ink boxes are found
# here from the native page's pixels (every ink pixel is at most INK_MAX in some channel, no paper pixel is), moved by
# the shift, and each glyph goes to the 8x8 token holding its box's centre: a token with one centre gets that
# character, one that some box reaches without a centre or with two centres is ignored (None), the rest are " ".
def ink_boxes(img, grid):
    dark = img.min(axis=2) <= INK_MAX
    out = {}
    for r, line in enumerate(grid):
        for c, ch in enumerate(line):
            if ch != " ":
                ys, xs = np.nonzero(dark[r * 8: r * 8 + 8, c * 8: c * 8 + 8])
                out[r, c] = (r * 8 + ys.min(), r * 8 + ys.max() + 1, c * 8 + xs.min(), c * 8 + xs.max() + 1)
    return out


bad_move, bad_targets, bad_cells, n_straddle = [], [], [], 0
for seed, shift in ((21, (3, 5)), (22, (7, 7)), (23, (0, 6)), (24, (1, 0)), (25, (4, 2))):
    for task in ("qa", "row", "read"):
        native, moved = gen_pages.item(seed, task), gen_pages.item(seed, task, shift=shift)
        img0, img1, grid = native["images"][0], moved["images"][0], native["grids"][0]
        dy, dx = shift
        h, w = img0.shape[:2]
        if not (img1.shape == img0.shape and np.array_equal(img1[dy:, dx:], img0[: h - dy, : w - dx])
                and all(np.array_equal(img1[dy - 1 - i, dx:], img0[i + 1, : w - dx]) for i in range(dy))
                and (img0.min(axis=2) <= INK_MAX).sum() == (img1.min(axis=2) <= INK_MAX).sum()):
            bad_move.append((seed, task))
        rows, cols = h // 8, w // 8
        centres, reached, token_of = {}, set(), {}
        for (r, c), (y0, y1, x0, x1) in ink_boxes(img0, grid).items():
            y0, y1, x0, x1 = y0 + dy, y1 + dy, x0 + dx, x1 + dx
            t = (int((y0 + y1) / 2 // 8), int((x0 + x1) / 2 // 8))
            token_of[r, c] = t
            centres.setdefault(t, []).append(grid[r][c])
            reached |= {(tr, tc) for tr in range(y0 // 8, -(-y1 // 8)) for tc in range(x0 // 8, -(-x1 // 8))}
            n_straddle += (y0 // 8, x0 // 8) != ((y1 - 1) // 8, (x1 - 1) // 8)
        want = [[centres[tr, tc][0] if len(centres.get((tr, tc), ())) == 1 else
                 None if (tr, tc) in reached else " " for tc in range(cols)] for tr in range(rows)]
        if moved["token_chars"] != [want] or moved["shift"] != shift or moved["max_tokens"] is not None:
            bad_targets.append((seed, task))
        for k, (cell0, cell1) in enumerate(zip(native["cells"], moved["cells"])):
            if (cell0 is None) != (cell1 is None) or (cell0 is not None and grid[cell0[1]][cell0[2]] != " " and
                                                      cell1 != (0, *token_of[cell0[1], cell0[2]])):
                bad_cells.append((seed, task, k))
check(not bad_move, f"a shifted page is the native one moved down and right, the paper mirrored in, no ink lost "
      f"({bad_move[:3]})")
check(not bad_targets, f"its token targets are those of the glyphs' moved ink boxes found from the pixels "
      f"({bad_targets[:3]})")
check(not bad_cells and n_straddle > 100, f"its answer cells are the tokens of the characters' moved centres "
      f"({bad_cells[:3]}; {n_straddle} glyph boxes straddle tokens)")
same = gen_pages.item(21, "qa", shift=(0, 0))
check(np.array_equal(same["images"][0], gen_pages.item(21, "qa")["images"][0]) and "token_chars" not in same,
      "shift (0, 0) is the native item")
both, resized = gen_pages.item(21, "qa", shift=(3, 5), token_share=0.5), gen_pages.item(21, "qa", token_share=0.5)
check(both["images"][0].shape == resized["images"][0].shape and both["shift"] == (3, 5) and
      not np.array_equal(both["images"][0], resized["images"][0]), "a shifted page resizes to the same token grid")
try:
    gen_pages.item(21, "qa", shift=(8, 0))
    check(False, "a shift of 8 pixels is refused")
except ValueError as e:
    check("0..7" in str(e), f"a shift of 8 pixels is refused: {e}")

finish()
