"""Merges the reports of bench/chunked-quality.sh into one table: per set, method and budget, the accuracy and the
fidelity to the full cache (greedy agreement, mean KL) of one-shot compression, of chunked prefill, and of one-shot
compression without the question when that run exists.

    python3 bench/chunked-quality.py OUT      (writes OUT/chunked-quality.md and OUT/chunked-quality.json)
"""
import json
import pathlib
import sys


def load(report_dir):
    """{(method, budget): {"score", "agreement", "mean_kl", "n"}} and the FullKV score of one report."""
    report = json.loads((report_dir / "report.json").read_text())
    (dataset,) = report.values()
    rows, full = {}, None
    for s in dataset["scores"]:
        if s["method"] == "FullKV":
            full = s["score"]
        else:
            rows[(s["method"], s["budget"])] = {"score": s["score"], "n": s["n"]}
    for f in dataset["fidelity"]:
        rows.setdefault((f["method"], f["budget"]), {}).update(agreement=f["agreement"], mean_kl=f["mean_kl"])
    return rows, full, dataset["metric"]


def main(out):
    out = pathlib.Path(out)
    sets, md = [], ["# Chunked prefill against one-shot compression, same budget", ""]
    for one_shot in sorted(out.glob("*-chunk0")):
        name = one_shot.name[: -len("-chunk0")]
        chunked = [d for d in out.glob(name + "-chunk*") if d != one_shot]
        if len(chunked) != 1 or not (one_shot / "report.json").exists() or not (chunked[0] / "report.json").exists():
            continue
        chunk = int(chunked[0].name.rsplit("-chunk", 1)[1])
        a, full, metric = load(one_shot)
        b, _, _ = load(chunked[0])
        agnostic = out / (name + "-agnostic")
        g = load(agnostic)[0] if (agnostic / "report.json").exists() else {}
        rows = []
        for key in sorted(a, key=lambda k: (k[0], -k[1])):
            if key in b:
                rows.append({"method": key[0], "budget": key[1], "one_shot": a[key], "chunked": b[key],
                             "one_shot_agnostic": g.get(key, {})})
        sets.append({"set": name, "chunk": chunk, "metric": metric, "full": full, "rows": rows})
        md += [f"## {name} (--chunk {chunk}, {metric}; FullKV {full:.1f})", "",
               "Score, greedy agreement and mean KL: one shot with the question in the prompt / chunked / one shot "
               "without the question (agnostic).", "",
               "| method | budget | score | agreement | KL |", "|---|---:|---:|---:|---:|"]
        cell = lambda r, k, f: " / ".join(f.format(r[m][k]) if k in r[m] else "-"
                                          for m in ("one_shot", "chunked", "one_shot_agnostic"))
        for r in rows:
            md.append(f"| {r['method']} | {r['budget']} | {cell(r, 'score', '{:.1f}')} "
                      f"| {cell(r, 'agreement', '{:.3f}')} | {cell(r, 'mean_kl', '{:.3f}')} |")
        md.append("")
    (out / "chunked-quality.json").write_text(json.dumps(sets, indent=1) + "\n")
    (out / "chunked-quality.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: chunked-quality.py OUT")
    main(sys.argv[1])
