#!/usr/bin/env python3
"""The table of vlm/long_outputs.sh: per budget and period N (0: the prompt compressed only), the chars score
against the truth, the chars score of the compressed answer against the full cache's (agreement; both with
`ecokv metric -m chars`), answer tokens, and decode tokens/s as a ratio to the same budget's prompt-only compression (the cost of compressing
again; the full cache's decode records attention probes for fidelity, so it is no fair yardstick).
Writes OUT/long-outputs.md and .csv. Usage: long_outputs_table.py OUT ECOKV"""

import csv
import glob
import json
import os
import subprocess
import sys
import tempfile


def chars(ecokv, pairs):
    """Mean chars score (`ecokv metric`) of predictions against references: [(prediction, reference)]."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for p, r in pairs:
            f.write(json.dumps({"prediction": p, "answers": [r]}) + "\n")
    try:
        res = subprocess.run([ecokv, "metric", "-m", "chars", "-i", f.name], check=True, capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    return 100.0 * json.loads(res.stdout)["score"]


def main():
    out, ecokv = sys.argv[1], sys.argv[2]
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "every-*", "results.jsonl")), key=lambda p: int(p.split("every-")[1].split("/")[0])):
        every = int(path.split("every-")[1].split("/")[0])
        recs = [json.loads(line) for line in open(path) if line.strip()]
        recs = [r for r in recs if r.get("error") is None]
        full = {r["id"]: r for r in recs if r["method"] == "full"}
        speed = lambda rs: sum(r["output_tokens"] for r in rs) / sum(r["decode_s"] for r in rs)  # noqa: E731
        for budget in sorted({r["budget"] for r in recs if r["method"] != "full"}):
            comp = [r for r in recs if r["budget"] == budget and r["method"] != "full" and r["id"] in full]
            if not comp or "output_tokens" not in comp[0]:
                continue
            rows.append({"every": every, "budget": budget, "n": len(comp),
                         "chars": sum(r["score"] for r in comp) / len(comp) * 100,
                         "full_chars": sum(full[r["id"]]["score"] for r in comp) / len(comp) * 100,
                         "agreement": chars(ecokv, [(r["prediction"], full[r["id"]]["prediction"]) for r in comp]),
                         "tokens": sum(r["output_tokens"] for r in comp) / len(comp),
                         "tokens_per_s": speed(comp)})
    for r in rows:
        base = [b for b in rows if b["budget"] == r["budget"] and b["every"] == 0]
        r["speed_vs_prompt_only"] = r["tokens_per_s"] / base[0]["tokens_per_s"] if base else float("nan")
    lines = ["| budget | compressed again every | chars vs truth (full cache) | chars vs the full cache's answer | "
             "answer tokens | decode tokens/s, vs prompt only |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["budget"], r["every"] == 0, r["every"])):
        every = "never (prompt only)" if r["every"] == 0 else f"{r['every']} cells"
        lines.append(f"| {r['budget']} | {every} | {r['chars']:.1f} ({r['full_chars']:.1f}) | {r['agreement']:.1f} | "
                     f"{r['tokens']:.0f} | {r['tokens_per_s']:.0f}, {r['speed_vs_prompt_only']:.2f} |")
    open(os.path.join(out, "long-outputs.md"), "w").write("\n".join(lines) + "\n")
    with open(os.path.join(out, "long-outputs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["every"])
        w.writeheader()
        w.writerows(rows)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
