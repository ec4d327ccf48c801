"""Tables of bench/bench-prefill.sh: per prompt size, the full prefill, one-shot compression and chunked prefill side
by side (time per phase, peak memory, prompt tokens/s), and the runs under a memory limit.

    python3 bench/bench-prefill-table.py OUT      (writes OUT/bench-prefill.md and OUT/bench-prefill.json)
"""
import json
import pathlib
import sys

MIB = 1024.0


def geometry(m):
    return (f"{m['arch']}, {m['n_layer']} layers, n_embd {m['n_embd']}, {m['n_head']}/{m['n_head_kv']} heads of "
            f"{m['head_dim']}, ff {m['n_ff']}, vocab {m['n_vocab']}, {m['weights']} ({m['n_params'] / 1e6:.0f} M)")


def main(out):
    out = pathlib.Path(out)
    md, sizes = ["# Chunked prefill against one-shot compression: memory and time", ""], []
    for size in ("2k", "8k", "32k"):
        runs = {m: json.loads((out / f"{size}-{m}.json").read_text())
                for m in ("full", "one-shot", "chunked") if (out / f"{size}-{m}.json").exists()}
        if not runs:
            continue
        any_run = next(iter(runs.values()))
        sizes.append({"size": size, "runs": runs})
        c = runs.get("chunked", {})
        md += [f"## {any_run['tokens']} tokens: {geometry(any_run['model'])}", "",
               f"{c.get('method', '')} B={c.get('budget', '')}, chunk {c.get('chunk', '')}, "
               f"{any_run['threads']} threads, ubatch {any_run['ubatch']}, flash attention {any_run['flash_attn']}.", "",
               "| run | prefill s | compress s | prompt tok/s | CPU share | peak RSS MiB | above model MiB "
               "| peak KV cells/head | peak KV MiB | KV after MiB | decode tok/s |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for m, r in runs.items():
            md.append(f"| {m} | {r['prefill_s']:.1f} | {r['compress_s']:.3f} | {r['prompt_tokens_per_s']:.1f} "
                      f"| {r['prefill_cpu_share']:.2f} | {r['peak_rss_kib'] / MIB:.0f} "
                      f"| {(r['peak_rss_kib'] - r['rss_model_kib']) / MIB:.0f} | {r['peak_kv_cells']} "
                      f"| {r['peak_kv_bytes'] / MIB / MIB:.1f} | {r['kv_bytes_allocated'] / MIB / MIB:.2f} "
                      f"| {r['decode_tokens_per_s']:.1f} |")
        if "one-shot" in runs and "chunked" in runs:
            o = runs["one-shot"]
            md += ["", f"Chunked / one-shot: peak RSS above the model "
                       f"{(c['peak_rss_kib'] - c['rss_model_kib']) / max(1, o['peak_rss_kib'] - o['rss_model_kib']):.2f}x, "
                       f"peak KV {c['peak_kv_bytes'] / o['peak_kv_bytes']:.3f}x, prompt time "
                       f"{o['prompt_tokens_per_s'] / c['prompt_tokens_per_s']:.2f}x."]
        md.append("")
    limited = []
    tsv = out / "memory-limit.tsv"
    if tsv.exists():
        md += ["## Under a memory limit (32k tokens, cgroup)", "", "| run | limit MiB | exit | cgroup |",
               "|---|---:|---:|---|"]
        for line in tsv.read_text().splitlines():
            mode, limit, rc, log = line.split("\t")
            limited.append({"mode": mode, "limit_mib": int(limit), "exit": int(rc), "log": log})
            outcome = "killed (SIGKILL)" if rc == "137" else ("completed" if rc == "0" else "failed")
            md.append(f"| {mode} | {limit} | {rc}: {outcome} | {log} |")
        md.append("")
    (out / "bench-prefill.json").write_text(json.dumps({"sizes": sizes, "memory_limit": limited}, indent=1) + "\n")
    (out / "bench-prefill.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench-prefill-table.py OUT")
    main(sys.argv[1])
