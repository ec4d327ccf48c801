#!/usr/bin/env python3
"""The page generator of tiny-qwen2vl (vlm/gen_pages.py): same seed, same bytes; pages of 20..24 x 20..24 cells of
8 pixels; ink only in the cells that hold a character (every glyph cell has a pixel at ink darkness, no background
cell has one); each answer character's cell holds that character; most cells are background; downscaled pages
have whole cells; reserved seeds are refused. Usage: test-gen-pages.py REPO_ROOT"""

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

finish()
