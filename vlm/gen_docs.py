#!/usr/bin/env python3
"""Synthetic document images and questions for the tiny VLM (receipts, forms, tables; a multi-image variant).

Every item is a pure function of its seed: item i of `--seed S` uses seed S + i, so the same seed gives the
same bytes. Seed ranges (see vlm/README.md):
  0 ..   249,999   held-out evaluation (vlm/eval sets, tests, the sample in models/)
  250,000 .. 999,999   reserved for external checks: never used by the project
  1,000,000 and up training (vlm/train.py draws only from there)

A page is a 12x12 grid of 8x8-pixel character cells (96x96 RGB), so the LLaVA ViT with 8-pixel patches sees
144 image tokens, one character each.

Usage: gen_docs.py --seed 0 --count 500 --out DIR [--task qa|read|row|multi]
writes DIR/images/*.png and DIR/items.jsonl ({"image": [...], "question", "answers", "type", "context", "id"}),
the `generated` dataset format of `ecokv eval`.
"""

import argparse
import json
import os
import random
import re
import struct
import sys
import tempfile
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from font5x7 import CHARSET, GLYPHS  # noqa: E402

GRID = 12  # characters per row and rows per page
CELL = 8  # pixels per character cell = ViT patch size
IMAGE_SIZE = GRID * CELL
FIRST_TRAIN_SEED = 1_000_000

ITEMS = ["MILK", "BREAD", "EGGS", "RICE", "TEA", "SOAP", "JAM", "FISH", "SALT", "OIL", "CAKE", "PEAS", "CORN",
         "BEEF", "SODA", "PLUM", "PEAR", "LIME", "OATS", "HAM", "KALE", "TUNA", "NUTS", "WINE", "BEER", "PIE",
         "SOUP", "FIG", "YAM", "HONEY", "APPLE", "LEMON", "MANGO", "PASTA", "FLOUR", "SUGAR", "BACON", "TOAST"]
FORM_LABELS = ["NAME", "DATE", "CITY", "ID", "CODE", "TEL", "AGE", "ZIP", "REF", "ROOM", "DEPT", "SEAT", "GATE",
               "UNIT", "ACCT", "CASE", "LOT", "BOX", "KEY", "TAG", "PIN", "VIN", "ROUTE", "SIZE", "TEAM"]
NAMES = ["ANNA", "BEN", "CARL", "DORA", "EVA", "FINN", "GUS", "HUGO", "IDA", "JON", "KIM", "LEO", "MAX", "NINA",
         "OTTO", "PIA", "ROSA", "SAM", "TOM", "UMA", "VERA", "WES", "ZOE", "ROME", "OSLO", "LIMA", "BERN", "KIEV",
         "BONN", "RIGA", "NICE", "GRAZ", "LYON", "BARI", "CORK", "YORK", "PISA", "TURIN", "PARIS", "MILAN"]
TITLES = ["RECEIPT", "MARKET", "CAFE", "STORE #", "SHOP", "DELI", "BAKERY", "GROCER"]
FORM_TITLES = ["FORM", "RECORD", "ENTRY", "TICKET", "PERMIT", "ORDER", "REPORT"]
NEEDLE_LABELS = ["SECRET", "PASS", "MAGIC", "VAULT"]
WORDS = ["the", "box", "was", "sent", "on", "a", "cold", "day", "and", "every", "note", "in", "it", "said",
         "nothing", "new", "so", "we", "kept", "reading", "until", "late", "at", "night", "blue", "door", "tree"]


def _atlas():
    glyphs = np.zeros((len(CHARSET), 7, 5), np.float32)
    for i, ch in enumerate(CHARSET):
        glyphs[i] = [[c == "#" for c in row] for row in GLYPHS[ch]]
    return glyphs


ATLAS = _atlas()
CHAR_INDEX = {ch: i for i, ch in enumerate(CHARSET)}


# --- field values --------------------------------------------------------------------------------------------
def price(rng):
    return f"{rng.randint(0, 99 if rng.random() < 0.6 else 9)}.{rng.randint(0, 99):02d}"


def form_value(rng, label):
    if label == "NAME" or label == "CITY":
        return rng.choice(NAMES)
    if label == "DATE":
        return f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}"
    if label == "CODE" or label == "REF" or label == "VIN":
        alphabet = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(3, 5)))
    return str(rng.randint(0, 10 ** rng.randint(1, 5) - 1))


# --- layouts: each returns (rows, fields); rows are strings of <= width chars (width: GRID here, wider in
# gen_pages.py), fields (label, value, question, type) ----------------------------------------------------------
def receipt(rng, n_fields, width=GRID):
    n_items = max(1, n_fields - 2)
    labels = rng.sample(ITEMS, n_items)
    rows, fields = [], []
    if rng.random() < 0.8:
        title = rng.choice(TITLES)
        title = title + str(rng.randint(1, 99)) if title.endswith("#") else title
        rows.append(title.center(width).rstrip() if rng.random() < 0.5 else title)
        if rng.random() < 0.5:
            rows.append("")
    cents = 0
    for label in labels:
        value = price(rng)
        cents += round(float(value) * 100)
        rows.append(label + value.rjust(width - len(label)))
        fields.append((label, value, f"What is the {label}?", "receipt-field"))
    tax = round(cents * rng.choice([5, 7, 8, 10]) / 100)
    extra = [("TAX", f"{tax // 100}.{tax % 100:02d}"), ("TOTAL", f"{(cents + tax) // 100}.{(cents + tax) % 100:02d}")]
    if rng.random() < 0.6:
        rows.append("-" * width)
    for label, value in extra[2 - (n_fields - n_items):]:  # 1 field: an item; 2: item + TOTAL; more: + TAX
        rows.append(label + value.rjust(width - len(label)))
        fields.append((label, value, f"What is the {label}?", "receipt-field"))
    return rows, fields


def form(rng, n_fields, width=GRID):
    labels = rng.sample(FORM_LABELS, n_fields)
    sep = rng.choice([": ", " ", ":"])
    indent = " " * rng.choice([0, 0, 1])
    rows, fields = [], []
    if rng.random() < 0.7:
        rows.append(rng.choice(FORM_TITLES) + (f" {rng.randint(1, 999)}" if rng.random() < 0.5 else ""))
        if rng.random() < 0.5:
            rows.append("")
    for label in labels:
        value = form_value(rng, label)[: width - len(indent) - len(label) - len(sep)]
        rows.append(indent + label + sep + value)
        fields.append((label, value, f"What is the {label}?", "form-field"))
        if rng.random() < 0.15:
            rows.append("")
    return rows, fields


def table(rng, n_fields, width=GRID):
    n_cols = rng.choice([2, 3]) if n_fields >= 4 else 2
    n_rows = max(2, -(-n_fields // n_cols))
    starts = [1, 5, 9] if n_cols == 3 else rng.choice([[1, 7], [2, 8], [0, 6]])
    digits = 3 if n_cols == 3 else 4
    rows, fields = [], []
    if rng.random() < 0.6:
        rows.append(rng.choice(["TABLE", "SCORES", "STOCK", "PRICES", "COUNTS"]) + f" {rng.randint(1, 9)}")
    header = [" "] * width
    for c, s in enumerate(starts):
        header[s] = "ABC"[c]
    rows.append("".join(header).rstrip())
    for r in range(n_rows):
        line = [" "] * width
        for c, s in enumerate(starts):
            value = str(rng.randint(0, 10 ** rng.randint(1, digits) - 1))
            line[s: s + len(value)] = value
            fields.append((f"R{r + 1}C{c + 1}", value, f"What is in row {r + 1}, column {c + 1}?", "table-cell"))
        rows.append("".join(line).rstrip())
    return rows, fields


LAYOUTS = {"receipt": receipt, "form": form, "table": table}


def make_page(rng, n_fields, layout=None):
    """A page: 12 text rows (placed with a random top offset) and its fields."""
    layout = layout or rng.choice(list(LAYOUTS))
    rows, fields = LAYOUTS[layout](rng, n_fields)
    rows = rows[:GRID]
    kept = {f for f in fields if any(f[1] and f[1] in r for r in rows)}
    fields = [f for f in fields if f in kept]
    top = rng.randint(0, GRID - len(rows))
    page = [""] * top + rows + [""] * (GRID - top - len(rows))
    return [r.ljust(GRID)[:GRID] for r in page], fields, layout


def render(page, rng):
    """RGB uint8 image (IMAGE_SIZE^2 x 3): one glyph per cell, random paper/ink colours, pixel noise."""
    idx = np.array([[CHAR_INDEX[ch] for ch in row] for row in page])
    ox, oy = rng.randint(1, 2), rng.randint(0, 1)
    cells = np.zeros((GRID, GRID, CELL, CELL), np.float32)
    cells[:, :, oy: oy + 7, ox: ox + 5] = ATLAS[idx]
    ink = cells.transpose(0, 2, 1, 3).reshape(IMAGE_SIZE, IMAGE_SIZE)
    paper = np.array([rng.randint(190, 255) for _ in range(3)], np.float32)
    color = np.array([rng.randint(0, 90) for _ in range(3)], np.float32)
    img = paper + ink[..., None] * (color - paper)
    if rng.random() < 0.3:  # shaded bands on alternate rows
        band = np.repeat((np.arange(GRID) % 2 == 1).astype(np.float32), CELL)[:, None, None]
        img -= band * (1.0 - ink[..., None]) * rng.randint(10, 35)
    noise = np.random.default_rng(rng.getrandbits(63)).integers(-16, 17, img.shape)
    return np.clip(np.rint(img) + noise, 0, 255).astype(np.uint8)


def transcript(page):
    return "\n".join(r.rstrip() for r in page if r.strip())


def answer_cells(pages, question, answer):
    """Where each answer character is printed: (page, row, column) per character, None for a newline (or where
    the page does not show it). Read from the question and the page text, as a reader would."""
    page = pages[0]
    if question == "Read all text.":
        cells = []
        for r, row in enumerate(page):
            if row.strip():
                cells += ([None] if cells else []) + [(0, r, c) for c in range(len(row.rstrip()))]
        return cells
    if m := re.fullmatch(r"Read line (\d+)\.", question):
        r = int(m[1]) - 1
        c0 = len(page[r]) - len(page[r].lstrip())
        return [(0, r, c0 + k) for k in range(len(answer))]
    if m := re.fullmatch(r"What is in row (\d+), column (\d+)\?", question):
        header = next(i for i, row in enumerate(page) if row.strip() and set(row) <= set("ABC "))
        return [(0, header + int(m[1]), page[header].index("ABC"[int(m[2]) - 1]) + k) for k in range(len(answer))]
    if m := re.fullmatch(r"What is the (\w+)\?", question):
        for p, pg in enumerate(pages):
            for r, row in enumerate(pg):
                if re.match(r" *" + m[1] + r"[: ]", row) and row.rstrip().endswith(answer):
                    c0 = len(row.rstrip()) - len(answer)
                    return [(p, r, c0 + k) for k in range(len(answer))]
    return [None] * len(answer)


# --- items --------------------------------------------------------------------------------------------------
def item(seed, task, n_fields=None, all_questions=False):
    """One sample: dict(pages=[page...], images=[array...], question, answer, type, context); with all_questions also
    all=[(q, a, type)...], every question of the task on the page in page order (the same random draws)."""
    rng = random.Random(seed)
    if task == "multi":
        return multi_item(rng)
    n = n_fields if n_fields is not None else rng.randint(4, 7)
    page, fields, layout = make_page(rng, n)
    image = render(page, rng)
    lines = [(f"Read line {r + 1}.", row.strip()) for r, row in enumerate(page) if row.strip()]
    pairs = {"read": [("Read all text.", transcript(page))], "row": lines, "qa": [(q, a) for _, a, q, _ in fields]}
    types = {"read": "read-all", "row": "read-line"}
    pick = rng.randrange(len(pairs[task]))
    q, a = pairs[task][pick]
    t = types.get(task) or fields[pick][3]
    # `others`: the page's other questions of the same task (training asks several per image)
    others = pairs[task][:pick] + pairs[task][pick + 1:]
    out = {"pages": [page], "images": [image], "question": q, "answer": a, "type": t, "context": "", "others": others}
    if all_questions:
        out["all"] = [(q, a, types.get(task) or fields[k][3]) for k, (q, a) in enumerate(pairs[task])]
    return out


def multi_item(rng):
    """MileBench-style needle: 2-4 pages and distractor text; one page holds the only NEEDLE field."""
    n_pages = rng.randint(2, 4)
    needle_page = rng.randrange(n_pages)
    label = rng.choice(NEEDLE_LABELS)
    value = str(rng.randint(100, 10 ** (GRID - len(label) - 2) - 1))  # "LABEL: VALUE" fits on one line
    pages, images = [], []
    for p in range(n_pages):
        page, _, _ = make_page(rng, rng.randint(3, 5), layout="form" if p == needle_page else None)
        if p == needle_page:
            slots = [i for i, r in enumerate(page) if not r.strip()] or [GRID - 1]
            page[rng.choice(slots)] = (label + ": " + value).ljust(GRID)[:GRID]
        pages.append(page)
        images.append(render(page, rng))
    context = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + "."
    return {"pages": pages, "images": images, "question": f"What is the {label}?", "answer": value,
            "type": "multi-needle", "context": context, "others": []}


# --- files --------------------------------------------------------------------------------------------------
def png_bytes(img):
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def write_atomic(path, data):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
    os.replace(tmp, path)


def write_set(out, seed, count, task, n_fields=None, make_item=None, encode_png=None):
    """DIR/images/*.png and DIR/items.jsonl for items seed..seed+count-1; make_item(seed, task, n_fields) and
    encode_png(image) default to this generator's (gen_pages.py passes its own)."""
    make_item, encode_png = make_item or item, encode_png or png_bytes
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    lines = []
    for i in range(count):
        s = seed + i
        it = make_item(s, task, n_fields)
        names = []
        for k, img in enumerate(it["images"]):
            name = f"images/{task}-{s}" + (f"-{k}" if len(it["images"]) > 1 else "") + ".png"
            write_atomic(os.path.join(out, name), encode_png(img))
            names.append(name)
        # one record per question: the item's, or every question of its page (it["all"], in page order)
        asked = it.get("all") or [(it["question"], it["answer"], it["type"])]
        for k, (q, a, t) in enumerate(asked):
            rec = {"id": f"{task}-{s}" + (f"-q{k + 1}" if len(asked) > 1 else ""), "image": names, "question": q,
                   "answers": [a], "type": t}
            if it["context"]:
                rec["context"] = it["context"]
            lines.append(json.dumps(rec))
        if (i + 1) % 100 == 0 or i + 1 == count:
            print(f"\r{i + 1}/{count} items", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    write_atomic(os.path.join(out, "items.jsonl"), ("\n".join(lines) + "\n").encode())


def set_options(doc):
    """The command line of both generators: --seed, --count, --out, --task, --fields."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, required=True, help="first item's seed (held-out: < 250,000; 250,000-999,999 reserved)")
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--task", choices=["qa", "read", "row", "multi"], default="qa")
    ap.add_argument("--fields", type=int, default=None, help="fields per page (default 4-7)")
    ap.add_argument("--all-questions", action="store_true",
                    help="one record per question of the task on each page, in page order (ids TASK-SEED-qK): "
                         "a page's records are one conversation for ecokv eval --turns")
    return ap


def check_seeds(ap, a):
    """Seeds from 0, at least one item, none in the reserved 250,000-999,999."""
    if a.seed < 0 or a.count <= 0:
        ap.error("--seed must be >= 0 and --count > 0")
    if 250_000 <= a.seed + a.count - 1 and a.seed < FIRST_TRAIN_SEED:
        ap.error("seeds 250,000-999,999 are reserved for external checks")


def main():
    ap = set_options(__doc__)
    a = ap.parse_args()
    check_seeds(ap, a)
    write_set(a.out, a.seed, a.count, a.task, a.fields, lambda seed, task, n: item(seed, task, n, a.all_questions))


if __name__ == "__main__":
    main()
