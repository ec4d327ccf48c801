#!/usr/bin/env python3
"""vlm/card_tables.py: the first table of each protocol's report, under a heading naming the extra rows present;
--publish copies the six report files and leaves no temporary file, even when a copy fails (a clear error); a missing
report, or one without a table, is an error. --geometry: the card's init -> trained table from two check_targets.py
results, rounded to 2 decimals; results that are not check_targets.py's, or of different heads, are clear errors.
Usage: test-card-tables.py REPO_ROOT"""

import json
import os
import subprocess
import sys
import tempfile

from checks import check, finish  # tests/vlm/checks.py

ROOT = sys.argv[1]
SCRIPT = os.path.join(ROOT, "vlm", "card_tables.py")
PAPER = """## generated (exact, x100)

| method | 64 |
|---|---:|
| FullKV | 90.0 ±3.0 |

Fidelity to FullKV (greedy agreement / mean KL / relative error):

| method | 64 |
|---|---:|
| uniform+snapkv | 0.5 / 1.0 / 0.2 |
"""
EQUAL = """## generated (exact, x100)

| method | 64 |
|---|---:|
| uniform+mixkv [window 8, mixkv_scale importance] | 40.0 ±2.0 (+1.0 ±0.5) |
| FullKV, smaller image | 30.0 ±2.0 (-9.0 ±2.0) |
"""
EXPECTED = """**Paper windows** (each method at its paper's window: 32 for SnapKV, MixKV and the SnapKV-scored allocators, \
ManifoldKV, KeyDiff, LOOK-M; 4 for ECOKV and StreamingLLM):

| method | 64 |
|---|---:|
| FullKV | 90.0 ±3.0 |

**Equal windows** (every method at window 8), with MixKV's and ECOKV's other SPEC §5.2 readings and the full cache \
of a smaller image as extra rows:

| method | 64 |
|---|---:|
| uniform+mixkv [window 8, mixkv_scale importance] | 40.0 ±2.0 (+1.0 ±0.5) |
| FullKV, smaller image | 30.0 ±2.0 (-9.0 ±2.0) |
"""

with tempfile.TemporaryDirectory() as tmp:
    out, dest = os.path.join(tmp, "eval"), os.path.join(tmp, "card", "eval")
    os.makedirs(out)
    for protocol, md in (("paper", PAPER), ("equal", EQUAL)):
        for ext, text in (("md", md), ("csv", f"csv {protocol}\n"), ("json", f'{{"{protocol}": 1}}\n')):
            with open(os.path.join(out, f"qa-agnostic-{protocol}.{ext}"), "w") as f:
                f.write(text)
    r = subprocess.run([sys.executable, SCRIPT, out, "qa-agnostic", "--publish", dest], capture_output=True, text=True)
    check(r.returncode == 0, f"exit 0 ({r.stderr.strip()})")
    check(r.stdout == EXPECTED, "both protocols' score tables, fidelity left out, headings naming the extra rows")
    if r.stdout != EXPECTED:
        print(r.stdout)
    published = sorted(os.listdir(dest))
    check(published == sorted(f"qa-agnostic-{p}.{e}" for p in ("paper", "equal") for e in ("md", "csv", "json")),
          f"six reports published, no temporary file: {published}")
    check(open(os.path.join(dest, "qa-agnostic-equal.csv")).read() == "csv equal\n", "published bytes unchanged")

    blocked = os.path.join(tmp, "blocked")
    os.makedirs(os.path.join(blocked, "qa-agnostic-paper.csv", "x"))  # a report's name taken by a directory
    r = subprocess.run([sys.executable, SCRIPT, out, "qa-agnostic", "--publish", blocked], capture_output=True, text=True)
    check(r.returncode == 1 and r.stderr.startswith(f"card_tables: cannot publish to {blocked}: ")
          and "Traceback" not in r.stderr, f"a failed copy is a clear error: {r.stderr.strip()}")
    left = sorted(os.listdir(blocked))
    check(left == ["qa-agnostic-paper.csv", "qa-agnostic-paper.md"], f"no temporary file left behind: {left}")

    with open(os.path.join(out, "qa-agnostic-paper.md"), "w") as f:
        f.write("## generated\n\nno table\n")
    r = subprocess.run([sys.executable, SCRIPT, out, "qa-agnostic"], capture_output=True, text=True)
    check(r.returncode != 0 and "no table in" in r.stderr, f"a report without a table is an error: {r.stderr.strip()}")

    r = subprocess.run([sys.executable, SCRIPT, out, "qa-prompt"], capture_output=True, text=True)
    check(r.returncode != 0 and "qa-prompt-paper.md missing" in r.stderr, f"a missing report is an error: {r.stderr.strip()}")

    def targets(path, heads, decided):
        geometry = [{"layer": l, "kv_head": h, "pair_cos_mean": c, "background_near_duplicates": d, "lambda": lam}
                    for (l, h, c, d, lam) in heads]
        with open(path, "w") as f:
            json.dump({"geometry": geometry, "decisions": {"decided_share": decided}}, f)
    init, trained = os.path.join(tmp, "init.json"), os.path.join(tmp, "trained.json")
    targets(init, [(1, 1, 0.914, 1.0, 0.5), (0, 0, 0.9, 0.996, 0.8), (1, 0, 0.5, 0.0, 0.25), (0, 1, 0.1, 0.2, 0.3)],
            [[0, 0], [0, 0]])
    targets(trained, [(0, 0, 0.333, 0.5, 0.45), (0, 1, 0.2, 0.6, 0.7), (1, 0, 0.8, 0.7, 0.6), (1, 1, 0.126, 0.9, 0.1)],
            [[0.0, 0.1], [0.42, 0.05]])
    r = subprocess.run([sys.executable, SCRIPT, "--geometry", init, trained], capture_output=True, text=True)
    want = """| layer | KV head | mean key cosine (init -> trained) | background near-duplicates (init -> trained) | \
lambda (init -> trained) | answers it decides |
|---:|---:|---:|---:|---:|---:|
| 0 | 0 | 0.90 -> 0.33 | 1.00 -> 0.50 | 0.80 -> 0.45 | 0.00 |
| 0 | 1 | 0.10 -> 0.20 | 0.20 -> 0.60 | 0.30 -> 0.70 | 0.10 |
| 1 | 0 | 0.50 -> 0.80 | 0.00 -> 0.70 | 0.25 -> 0.60 | 0.42 |
| 1 | 1 | 0.91 -> 0.13 | 1.00 -> 0.90 | 0.50 -> 0.10 | 0.05 |
"""
    check(r.returncode == 0 and r.stdout == want, f"geometry table, rows by (layer, head): {r.stdout}{r.stderr}")
    targets(trained, [(0, 0, 0.3, 0.5, 0.4)], [[0.0]])
    r = subprocess.run([sys.executable, SCRIPT, "--geometry", init, trained], capture_output=True, text=True)
    check(r.returncode == 1 and "different (layer, KV head) sets" in r.stderr, f"other heads: {r.stderr.strip()}")
    with open(trained, "w") as f:
        f.write("{}")
    r = subprocess.run([sys.executable, SCRIPT, "--geometry", init, trained], capture_output=True, text=True)
    check(r.returncode == 1 and "not a check_targets.py result" in r.stderr and "Traceback" not in r.stderr,
          f"not a result: {r.stderr.strip()}")

finish()
