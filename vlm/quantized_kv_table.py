#!/usr/bin/env python3
"""Tables of vlm/quantized_kv.sh's runs: accuracy and KV memory per cache type, method and budget, and whether the
loss of quantization adds to the loss of eviction.

    python3 vlm/quantized_kv_table.py vlm/runs/quantized > table.md

Reads OUT/<type>-<protocol>/results.jsonl (ecokv eval). Accuracy is exact match x100 with its standard error; KV is
the mean of kv_bytes_compressed (what the sequence allocates: kept entries, label rows and room, or the full cache),
in KiB. "Added" compares the loss against f16 FullKV of eviction at f16 plus quantization of FullKV with the loss of
both together, paired over items (mean and standard error of the per-item interaction).
"""
import json
import math
import sys
from pathlib import Path

TYPES = ["f16", "q8_0", "q4_0"]
METHODS = ["full", "uniform+snapkv", "uniform+mixkv", "uniform+ecokv"]
BUDGETS = [200, 100, 50]


def load(path):
    runs = {}
    for line in open(path):
        r = json.loads(line)
        runs[(r["method"], r["budget"], r["id"])] = r
    return runs


def mean_se(xs):
    n = len(xs)
    m = sum(xs) / n
    var = sum((x - m) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return m, math.sqrt(var / n)


def main(out):
    out = Path(out)
    for protocol in ["equal", "paper"]:
        runs = {t: load(out / f"{t}-{protocol}" / "results.jsonl") for t in TYPES
                if (out / f"{t}-{protocol}" / "results.jsonl").exists()}
        if not runs:
            continue
        ids = sorted({k[2] for r in runs.values() for k in r})
        score = lambda t, m, b, i: runs[t][(m, 0 if m == "full" else b, i)]["score"]
        print(f"### {'window 8' if protocol == 'equal' else 'the paper windows'} ({len(ids)} items)\n")
        print("| cache | method | " + " | ".join(f"{b}: acc / KV KiB" for b in BUDGETS) + " |")
        print("|---|---|" + "---:|" * len(BUDGETS))
        for t in runs:
            for m in METHODS:
                cells = []
                for b in BUDGETS:
                    rows = [runs[t][(m, 0 if m == "full" else b, i)] for i in ids]
                    acc, se = mean_se([100 * r["score"] for r in rows])
                    kib = sum(r["kv_bytes_compressed"] for r in rows) / len(rows) / 1024
                    cells.append(f"{acc:.1f} ±{se:.1f} / {kib:.0f}")
                    if m == "full":
                        cells = cells * len(BUDGETS)
                        break
                print(f"| {t} | {'FullKV' if m == 'full' else m} | " + " | ".join(cells) + " |")
        print()
        if "f16" not in runs:
            continue
        print("Loss against f16 FullKV, x100: eviction at f16 + quantization of FullKV = predicted, "
              "against both together (measured); interaction = measured - predicted, paired over items.\n")
        print("| cache | method | " + " | ".join(f"{b}: predicted / measured / interaction" for b in BUDGETS) + " |")
        print("|---|---|" + "---:|" * len(BUDGETS))
        for t in [t for t in runs if t != "f16"]:
            for m in METHODS[1:]:
                cells = []
                for b in BUDGETS:
                    base = [score("f16", "full", b, i) for i in ids]
                    ev = [base[k] - score("f16", m, b, i) for k, i in enumerate(ids)]
                    qu = [base[k] - score(t, "full", b, i) for k, i in enumerate(ids)]
                    both = [base[k] - score(t, m, b, i) for k, i in enumerate(ids)]
                    inter = [100 * (both[k] - ev[k] - qu[k]) for k in range(len(ids))]
                    im, ise = mean_se(inter)
                    cells.append(f"{100 * (sum(ev) + sum(qu)) / len(ids):.1f} / {100 * sum(both) / len(ids):.1f} / "
                                 f"{im:+.1f} ±{ise:.1f}")
                print(f"| {t} | {m} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: quantized_kv_table.py OUT")
    main(sys.argv[1])
