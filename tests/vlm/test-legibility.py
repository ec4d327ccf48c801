#!/usr/bin/env python3
"""vlm/legibility.py: the oracle's premise, that a page drawn again with one character swapped differs from the
original only inside that glyph's 5x7 box (checked pixel by pixel here, for every candidate character); the glyph's
window in a resized image, against a hand computation; bad options are clear errors.
Usage: test-legibility.py REPO_ROOT"""

import os
import subprocess
import sys

import numpy as np

from checks import check, finish  # tests/vlm/checks.py

ROOT = sys.argv[1]
sys.path.insert(0, os.path.join(ROOT, "vlm"))
import legibility  # noqa: E402

seed = 7  # a held-out QA seed
grid, img, boxes = legibility.page(seed)
import gen_pages  # noqa: E402
native = gen_pages.item(seed, "qa")
check(np.array_equal(img, native["images"][0]) and grid == native["grids"][0], "page() draws the generator's page")
for k in (0, len(boxes) // 2, len(boxes) - 1):
    r, c, y, x = boxes[k]
    outside_ok, changed = True, 0
    for ch in legibility.CANDIDATES:
        g2, img2, boxes2 = legibility.page(seed, (r, c, ch))
        diff = np.any(img2 != img, axis=-1)
        inside = np.zeros_like(diff)
        inside[y:y + 7, x:x + 5] = True
        outside_ok &= not diff[~inside].any() and boxes2 == boxes and g2[r][c] == ch
        changed += ch != grid[r][c] and diff[inside].any()
    check(outside_ok, f"glyph {k} ({grid[r][c]!r} at row {r}, column {c}): every swap changes only its 5x7 box")
    check(changed == len(legibility.CANDIDATES) - 1, f"glyph {k}: every other character changes the box ({changed})")

# resized by half into a 100x80 image with the content at (2, 1), 96x78 of it: box (16, 40) -> y 1 + 8 .. 1 + 11.5,
# x 2 + 20 .. 2 + 22.5, widened by 2 and rounded outwards
check(legibility.window((100, 80, 2, 1, 96, 78), (156, 192), (16, 40)) == (7, 15, 20, 27), "the glyph's window")
check(legibility.window((100, 80, 0, 0, 100, 80), (80, 100), (0, 0))[0::2] == (0, 0), "clipped at the image's edge")

script = os.path.join(ROOT, "vlm", "legibility.py")
for args, words in ((["--pages", "0"], "at least 1"), (["--noise", "-1"], "at least 0"),
                    (["--seed", "249999", "--pages", "2"], "held-out seeds only")):
    r = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
    check(r.returncode == 2 and words in r.stderr, f"{' '.join(args)}: a clear error ({r.stderr.strip()[-80:]})")
finish()
