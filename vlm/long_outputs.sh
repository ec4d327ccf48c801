#!/usr/bin/env bash
# Long answers compressed as they grow (issue 31, docs/conversations.md): "Read all text." on held-out pages
# (answers of 100+ tokens), the prompt compressed to BUDGETS entries per head, then the cache compressed again
# every N decoded cells (--decode-compress N) or never (N 0: the prompt's compression only), against the full cache.
#
#   bash vlm/long_outputs.sh [PREFIX] [OUT]   (defaults: models/tiny-qwen2vl, vlm/runs/long-outputs-tiny-qwen2vl)
#   COUNT=100 BUDGETS=100,200 EVERY="0 8 32 128" WINDOW=4 THREADS=1 LIMIT=0
#
# Window 4 for every run, so that a period of 8 exceeds it. Held-out "read" pages: seeds 100000.. (the card's read
# set). Resumable (ecokv eval); the table goes to OUT/long-outputs.{md,csv}.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-models/tiny-qwen2vl}
name=$(basename "$prefix")
out=${2:-vlm/runs/long-outputs-$name}
count=${COUNT:-100} budgets=${BUDGETS:-100,200} window=${WINDOW:-4} threads=${THREADS:-1}
py=/usr/bin/python3
gen=vlm/gen_pages.py
[[ $name == tiny-vlm ]] && gen=vlm/gen_docs.py
mkdir -p "$out"
[ -f "$out/data/items.jsonl" ] || $py $gen --seed 100000 --count "$count" --task read --out "$out/data"
for n in ${EVERY:-0 8 32 128}; do
    echo "== $name: decode-compress $n" >&2
    build/bin/ecokv eval --model "$prefix.gguf" --mmproj "$prefix-mmproj.gguf" --dataset generated --data "$out/data" \
        --metric chars --methods full,snapkv+ecokv --budgets "$budgets" --window "$window" --decode-compress "$n" \
        -n 160 -t "$threads" --limit "${LIMIT:-0}" --out "$out/every-$n"
done
$py vlm/long_outputs_table.py "$out" build/bin/ecokv
