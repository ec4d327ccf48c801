#!/usr/bin/env python3
"""The document generator of the tiny VLM: same seed, same bytes (also the committed held-out sample); another
seed, other bytes; and every page's text is what the image shows (ink exactly in the non-blank cells), with each
answer written on the page. Usage: test-gen-docs.py REPO_ROOT"""

import json
import os
import subprocess
import sys
import tempfile
import zlib

ROOT = sys.argv[1]
GEN = os.path.join(ROOT, "vlm", "gen_docs.py")
SAMPLE = os.path.join(ROOT, "tests", "data", "tiny-vlm")
from checks import check, finish  # noqa: E402  (tests/vlm/checks.py)
sys.path.insert(0, os.path.join(ROOT, "vlm"))
import gen_docs  # noqa: E402

def generate(out, seed, count, task):
    subprocess.run([sys.executable, GEN, "--seed", str(seed), "--count", str(count), "--task", task, "--out", out],
                   check=True, capture_output=True)


def files(d):
    out = {}
    for base, _, names in os.walk(d):
        for n in names:
            p = os.path.join(base, n)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


def decode_png(data):
    """RGB rows of an 8-bit truecolour PNG written with filter 0 (what the generator writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n = int.from_bytes(data[pos: pos + 4], "big")
        kind, body = data[pos + 4: pos + 8], data[pos + 8: pos + 8 + n]
        if kind == b"IHDR":
            w, h = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = 1 + 3 * w
    return w, h, [raw[y * stride + 1: (y + 1) * stride] for y in range(h)]


with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, tempfile.TemporaryDirectory() as c:
    for task in ("qa", "read", "multi"):
        generate(os.path.join(a, task), 7, 6, task)
        generate(os.path.join(b, task), 7, 6, task)
        generate(os.path.join(c, task), 8, 6, task)
    fa, fb, fc = files(a), files(b), files(c)
    check(len(fa) > 20 and fa == fb, f"same seed, same bytes ({len(fa)} files)")
    check(fa["qa/items.jsonl"] != fc["qa/items.jsonl"], "another seed, other items")

    sample = files(SAMPLE)
    n = sum(1 for _ in open(os.path.join(SAMPLE, "items.jsonl")))
    with tempfile.TemporaryDirectory() as d:
        generate(d, 0, n, "qa")
        check(files(d) == sample, f"the committed held-out sample (qa, seeds 0..{n - 1}) regenerates byte for byte")

    # Independent of the renderer: a cell holds ink exactly when the page has a character there.
    for seed in range(40):
        for task in ("qa", "multi"):
            it = gen_docs.item(seed, task)
            for page, img in zip(it["pages"], it["images"]):
                w, h, rows = decode_png(gen_docs.png_bytes(img))
                assert (w, h) == (96, 96)
                for r in range(12):
                    for col in range(12):
                        darkest = min(min(rows[r * 8 + y][(col * 8 + x) * 3: (col * 8 + x) * 3 + 3])
                                      for y in range(8) for x in range(8))
                        if (darkest < 120) != (page[r][col] != " "):
                            check(False, f"{task} seed {seed}: cell ({r},{col}) '{page[r][col]}' darkest {darkest}")
            text = "\n".join("\n".join(p) for p in it["pages"])
            if it["answer"] not in text:
                check(False, f"{task} seed {seed}: answer {it['answer']!r} is not on the page")
    check(True, "40 qa and 40 multi items: ink exactly in the non-blank cells; every answer is on a page")

    items = [json.loads(line) for line in open(os.path.join(a, "qa", "items.jsonl"))]
    check(all(set(i) >= {"id", "image", "question", "answers", "type"} for i in items), "items.jsonl fields")
    check(gen_docs.FIRST_TRAIN_SEED == 1_000_000, "training seeds start at 1,000,000 (held-out: below)")

    # --all-questions (ecokv eval --turns): a page's every question in page order, the same page and draws; each
    # answer is on the page and the single item's question is one of them.
    for seed in range(20):
        one, every = gen_docs.item(seed, "qa", 5), gen_docs.item(seed, "qa", 5, all_questions=True)
        asked = every["all"]
        text = "\n".join(every["pages"][0])
        ok = (every["pages"] == one["pages"] and len(asked) in (5, 6) and (one["question"], one["answer"]) in
              [(q, a) for q, a, _ in asked] and all(a in text for _, a, _ in asked) and
              len({q for q, _, _ in asked}) == len(asked))
        if not ok:
            check(False, f"seed {seed}: --all-questions {asked}")
    check(True, "--all-questions with 5 fields: 5 distinct questions a page (6 where a table fills its rows), answers "
                "on it, the item's among them")

finish()
