#!/usr/bin/env bash
# Multi-turn accuracy (issue 31, docs/conversations.md): 5-question pages asked as one conversation each
# (ecokv eval --turns), with the full cache, compressed once after the page (later turns appended), and compressed
# again after every answer (--recompress-slack), for SnapKV, MixKV, SnapKV + ECOKV and AdaKV + ECOKV at one budget.
#
#   bash vlm/turns.sh [PREFIX] [OUT]     (defaults: models/tiny-qwen2vl, vlm/runs/turns-tiny-qwen2vl)
#   COUNT=200 BUDGET=100 SLACK=32 WINDOW=8 THREADS=1 LIMIT=0
#
# Held-out pages: seeds 210000.. (gen_pages.py for tiny-qwen2vl, gen_docs.py for tiny-vlm; --fields 5
# --all-questions), the first 5 questions of each page. Resumable (ecokv eval); the table goes to OUT/turns.{md,csv}.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-models/tiny-qwen2vl}
name=$(basename "$prefix")
out=${2:-vlm/runs/turns-$name}
count=${COUNT:-200} budget=${BUDGET:-100} slack=${SLACK:-32} window=${WINDOW:-8} threads=${THREADS:-1}
py=/usr/bin/python3
gen=vlm/gen_pages.py
[[ $name == tiny-vlm ]] && gen=vlm/gen_docs.py
mkdir -p "$out"
if [ ! -f "$out/data/items.jsonl" ]; then
    $py $gen --seed 210000 --count "$count" --task qa --fields 5 --all-questions --out "$out/data.tmp"
    # the first 5 questions of a page (a table's sixth cell left out): 5-turn conversations
    $py -c 'import json, sys
for line in open(sys.argv[1]):
    if int(json.loads(line)["id"].rsplit("-q", 1)[1]) <= 5:
        print(line, end="")' "$out/data.tmp/items.jsonl" > "$out/data.tmp/items.5"
    mv "$out/data.tmp/items.5" "$out/data.tmp/items.jsonl"
    rm -rf "$out/data" && mv "$out/data.tmp" "$out/data"
fi
methods=full,snapkv,snapkv+mixkv,snapkv+ecokv,adakv+ecokv
for run in once:-1 again:$slack; do
    echo "== $name: ${run%%:*} (recompress-slack ${run#*:})" >&2
    build/bin/ecokv eval --model "$prefix.gguf" --mmproj "$prefix-mmproj.gguf" --dataset generated --data "$out/data" \
        --turns --methods "$methods" --budgets "$budget" --window "$window" --recompress-slack "${run#*:}" -n 16 \
        -t "$threads" --limit "${LIMIT:-0}" --out "$out/${run%%:*}"
done
$py vlm/turns_table.py "$out/once/results.jsonl" "$out/again/results.jsonl" "$out/turns"
