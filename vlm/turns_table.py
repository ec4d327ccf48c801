#!/usr/bin/env python3
"""Per-turn accuracy of ecokv eval --turns runs (vlm/turns.sh): for each method, the full cache, compressed once
(later turns appended) and compressed again after each answer; exact match, agreement with the full cache's
conversation, and the longest head's entries after the turn (mean). Writes OUT.md and OUT.csv.
Usage: turns_table.py ONCE/results.jsonl AGAIN/results.jsonl OUT"""

import collections
import csv
import json
import sys


def load(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def table(once, again):
    """{(method, variant): {turn: (n, accuracy %, same-as-full %, mean entries)}} with variant full/once/again."""
    cells = collections.defaultdict(lambda: collections.defaultdict(list))
    for variant, recs in (("once", once), ("again", again)):
        for r in recs:
            if r.get("error") is not None:
                continue
            key = ("full", "full") if r["method"] == "full" else (r["method"], variant)
            if key == ("full", "full") and variant == "again":
                continue  # the same conversations as in the first run
            cells[key][r["turn"]].append(r)
    out = {}
    for key, turns in cells.items():
        out[key] = {t: (len(rs), 100.0 * sum(r["score"] for r in rs) / len(rs),
                        100.0 * sum(bool(r["same_as_full"]) for r in rs) / len(rs),
                        sum(r["entries_held"] for r in rs) / len(rs)) for t, rs in sorted(turns.items())}
    return out


def main():
    once, again, out = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
    t = table(once, again)
    turns = sorted({k for v in t.values() for k in v})
    methods = [m for m, v in t if v != "full"]
    methods = sorted(set(methods), key=methods.index)
    budget = next(r["budget"] for r in once if r["method"] != "full")
    lines = [f"Exact match per turn (%), {t[('full', 'full')][1][0]} conversations; budget {budget}. "
             "once: compressed after the page, later turns appended; again: compressed again after each answer. "
             "In brackets: % of answers equal to the full cache conversation's; last column: mean entries of the "
             "longest head after the last turn.", "",
             "| method | cache | " + " | ".join(f"turn {k}" for k in turns) + " | entries after the last |",
             "|---|---|" + "---|" * len(turns) + "---|"]
    rows = []

    def add(method, variant, label):
        v = t.get((method, variant))
        if not v:
            return
        cells = [f"{v[k][1]:.1f} ({v[k][2]:.0f})" if k in v else "-" for k in turns]
        lines.append(f"| {method} | {label} | " + " | ".join(cells) + f" | {v[turns[-1]][3]:.0f} |")
        for k in turns:
            if k in v:
                rows.append([method, label, k, v[k][0], f"{v[k][1]:.2f}", f"{v[k][2]:.2f}", f"{v[k][3]:.1f}"])

    add("full", "full", "full")
    for m in methods:
        add(m, "once", "once")
        add(m, "again", "again")
    open(out + ".md", "w").write("\n".join(lines) + "\n")
    with open(out + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "cache", "turn", "n", "exact_match", "same_as_full", "entries_held"])
        w.writerows(rows)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
