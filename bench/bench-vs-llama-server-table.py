"""The table of bench/bench-vs-llama-server.sh: its runs (DIR/all.jsonl) and answer checks (DIR/check-*.json) into one
JSON (written by rename) and a markdown table, ecokv beside llama-server per row and round.
    bench-vs-llama-server-table.py DIR OUT.json SECONDS_PER_POINT BUDGET"""
import json
import os
import sys

ROW_NAMES = {
    "one-page": "one page, a new question each request",
    "unseen": "unseen pages",
    "recurring": "4-turn conversations over 120 recurring pages",
    "memory": "4-turn conversations on unseen pages, 4 MiB of conversation cache",
    "memory-served": "the same, llama-server with an HTTP thread for every client",
    "full-unseen": "unseen pages, ecokv with full caches (--full)",
}


def main():
    work, out, seconds, budget = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    runs = [json.loads(line) for line in open(f"{work}/all.jsonl")]
    checks = {s: json.load(open(f"{work}/check-{s}.json")) for s in ("ecokv-full", "ecokv", "llama")}
    answers = {s: [a["answer"] for a in c["answers"]] for s, c in checks.items()}
    prompts = {s: [a["prompt_tokens"] for a in c["answers"]] for s, c in checks.items()}
    check = {
        "questions": len(answers["llama"]),
        "same_prompt_tokens": prompts["ecokv"] == prompts["llama"] == prompts["ecokv-full"],
        "prompt_tokens": prompts["llama"],
        "full_equal_llama": sum(a == b for a, b in zip(answers["ecokv-full"], answers["llama"])),
        "compressed_equal_llama": sum(a == b for a, b in zip(answers["ecokv"], answers["llama"])),
        "answers": checks,
    }
    native = json.load(open(f"{work}/native.json")) if os.path.exists(f"{work}/native.json") else None
    setup = json.load(open(f"{work}/setup.json")) if os.path.exists(f"{work}/setup.json") else None
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"seconds_per_point": seconds, "budget": budget, "ggml_native": native, "setup": setup,
                   "check": check, "runs": runs}, f, indent=1)
    os.replace(tmp, out)

    if setup:
        print(f"setup {setup['setup']}: ecokv {setup['ecokv']}, llama-server {setup['llama_server']}, "
              f"answers of {setup['max_tokens']} tokens")
    if native:
        print(f"ggml built for this CPU (GGML_NATIVE): ecokv {native['ecokv']}, llama-server {native['llama_server']}")
    print(f"prompt tokens of the 8 check questions: {check['prompt_tokens']} "
          f"({'the same on both servers' if check['same_prompt_tokens'] else 'DIFFERENT between the servers'}); "
          f"answers equal to llama-server's: full cache {check['full_equal_llama']}/{check['questions']}, "
          f"compressed (budget {budget}) {check['compressed_equal_llama']}/{check['questions']}\n")
    print("| row | clients | round | ecokv req/s | llama-server req/s | ratio | answer tok/s ecokv / llama | "
          "p50 / p99 ms ecokv | "
          "p50 / p99 ms llama-server | later turns p50 ms ecokv / llama | cached ecokv / llama | "
          "CPU/wall ecokv / llama | KV held ecokv; llama-server |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    keys = sorted({(r["row"], r["round"]) for r in runs}, key=lambda k: (list(dict.fromkeys(r["row"] for r in runs)).index(k[0]), k[1]))
    for row, rnd in keys:
        e = next(r for r in runs if r["row"] == row and r["round"] == rnd and r["server"] == "ecokv")
        ll = next(r for r in runs if r["row"] == row and r["round"] == rnd and r["server"] == "llama")
        later = (f"{e['later_p50']:.0f} / {ll['later_p50']:.0f}" if e["later_p50"] is not None else "-")
        print(f"| {ROW_NAMES[row.rsplit('-', 1)[0]]} | {e['clients']} | {rnd} | {e['rps']:.2f} | {ll['rps']:.2f} | "
              f"**{e['rps'] / ll['rps']:.2f}x** | {e.get('completion_tps', 0):.0f} / {ll.get('completion_tps', 0):.0f} | "
              f"{e['p50']:.0f} / {e['p99']:.0f} | {ll['p50']:.0f} / {ll['p99']:.0f} | "
              f"{later} | {100 * e['cached_share']:.0f}% / {100 * ll['cached_share']:.0f}% | "
              f"{e['cpu_per_wall']:.2f} / {ll['cpu_per_wall']:.2f} | {e['kv']}; {ll['kv']} |")


if __name__ == "__main__":
    main()
