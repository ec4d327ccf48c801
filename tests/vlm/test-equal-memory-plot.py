#!/usr/bin/env python3
"""vlm/equal_memory_plot.py: ecokv eval records grouped into series (the full cache of the native page, of smaller
images, each method, a smaller image plus eviction), each point the mean score x100 with its standard error and the
mean KV entries per head (a compressed cache: its budget; a full cache: its prompt), computed here by hand from four
records per point; the files are written whole; no results is a clear error.
Usage: test-equal-memory-plot.py REPO_ROOT"""

import json
import os
import subprocess
import sys
import tempfile

from checks import check, finish  # tests/vlm/checks.py

ROOT = sys.argv[1]
SCRIPT = os.path.join(ROOT, "vlm", "equal_memory_plot.py")


def write(out, run, records):
    os.makedirs(os.path.join(out, run))
    with open(os.path.join(out, run, "results.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def records(method, budget, scores, prompt_tokens, prefill_s=(0.01, 0.02, 0.03, 0.04)):
    return [{"id": f"q{i}", "method": method, "budget": budget, "score": s, "prompt_tokens": p, "prefill_s": t}
            for i, (s, p, t) in enumerate(zip(scores, prompt_tokens, prefill_s))]


with tempfile.TemporaryDirectory() as out:
    write(out, "agnostic-methods", records("full", 0, [1, 1, 1, 0], [505, 509, 513, 517])
          + records("uniform+ecokv", 100, [1, 1, 0, 0], [505, 509, 513, 517]))
    write(out, "agnostic-image-100", records("full", 100, [1, 0, 0, 0], [90, 95, 96, 99], [0.002, 0.003, 0.003, 0.004]))
    write(out, "agnostic-both-100", records("uniform+ecokv", 100, [0, 0, 0, 0], [190, 195, 196, 199]))
    r = subprocess.run([sys.executable, SCRIPT, out], capture_output=True, text=True)
    check(r.returncode == 0, f"exit 0 ({r.stderr.strip()})")
    md = open(os.path.join(out, "equal-memory.md")).read() if r.returncode == 0 else ""
    # full: mean 75, sd sqrt((3 x 25^2 + 75^2) / 3) = 50, se 25, entries (505 + 509 + 513 + 517) / 4 = 511
    check("| full cache, native page | - | 75.0 ±25.0 (511) |" in md, "the native page's full cache: 75.0 ±25.0 (511)")
    # smaller image: mean 25, se 25, entries (90 + 95 + 96 + 99) / 4 = 95
    check("| full cache, smaller image | 25.0 ±25.0 (95) | - |" in md, "the smaller image: 25.0 ±25.0 (95)")
    # eviction: mean 50, sd sqrt(4 x 50^2 / 3) = 57.7, se 28.9, entries the budget
    check("| uniform+ecokv | 50.0 ±28.9 (100) | - |" in md, "eviction at 100: 50.0 ±28.9 (100 entries)")
    check("| smaller image + snapkv+ecokv | 0.0 ±0.0 (100) | - |" in md, "both at once: 0.0 (100 entries)")
    csv = open(os.path.join(out, "equal-memory.csv")).read() if r.returncode == 0 else ""
    check("agnostic,full cache, smaller image,100,95.0,25.00,25.00,4,3.00" in csv.replace('"', ""), "the CSV row")
    # prefill: (10 + 20 + 30 + 40) / 4 = 25 ms on the native page; (2 + 3 + 3 + 4) / 4 = 3 ms on the smaller image
    check("| full cache, native page | - | 25.0 |" in md, "the native page's prefill: 25.0 ms")
    check("| full cache, smaller image | 3.0 | - |" in md, "the smaller image's prefill: 3.0 ms")
    check(os.path.getsize(os.path.join(out, "equal-memory.png")) > 1000 if r.returncode == 0 else False, "a plot")
    check(not [f for f in os.listdir(out) if ".tmp" in f], "no temporary file left")

with tempfile.TemporaryDirectory() as out:
    r = subprocess.run([sys.executable, SCRIPT, out], capture_output=True, text=True)
    check(r.returncode != 0 and "no {agnostic,prompt}-*/results.jsonl" in r.stderr, "no results: a clear error")
finish()
