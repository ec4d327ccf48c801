#!/usr/bin/env bash
# Evaluate the exported tiny VLM through llama.cpp (ecokv eval) on held-out generated items: full cache and the
# model card's methods at budgets 16/32/64, question-agnostic (primary) and question-in-prompt, plus
# transcription (character accuracy) and the multi-image needle variant.
#
#   bash vlm/evaluate.sh [PREFIX] [OUT]      (defaults: models/tiny-vlm, vlm/runs/eval)
#   LIMIT=20 bash vlm/evaluate.sh ...        (only the first 20 items of each set: a quick check)
#
# Held-out seeds (disjoint from training, which uses >= 1,000,000): QA 0..499, transcription 100000..100099,
# multi-image 200000..200099. Results: OUT/<set>-<mode>/ (JSONL records, report.md/csv/json).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-models/tiny-vlm}
out=${2:-vlm/runs/eval}
ecokv=build/bin/ecokv
py=/usr/bin/python3
methods=full,snapkv,snapkv+mixkv,snapkv+ecokv,pyramidkv+ecokv,madakv
budgets=16,32,64

[ -x "$ecokv" ] || { echo "evaluate: build ecokv first (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$out"
[ -f "$out/data/qa/items.jsonl" ] || $py vlm/gen_docs.py --seed 0 --count 500 --task qa --out "$out/data/qa"
[ -f "$out/data/read/items.jsonl" ] || $py vlm/gen_docs.py --seed 100000 --count 100 --task read --out "$out/data/read"
[ -f "$out/data/multi/items.jsonl" ] || $py vlm/gen_docs.py --seed 200000 --count 100 --task multi --out "$out/data/multi"

run() {  # set mode n_predict [extra options]
    local set=$1 mode=$2 n=$3
    shift 3
    echo "== $set, $mode" >&2
    "$ecokv" eval --model "$prefix.gguf" --mmproj "$prefix-mmproj.gguf" --dataset generated --data "$out/data/$set" \
        --methods "$methods" --budgets "$budgets" --window 8 --mode "$mode" -n "$n" --limit "${LIMIT:-0}" "$@" --out "$out/$set-$mode"
    "$ecokv" report "$out/$set-$mode" >/dev/null
}

run qa agnostic 12
run qa prompt 12
run read agnostic 160 --metric chars
run multi agnostic 12
for d in qa-agnostic qa-prompt read-agnostic multi-agnostic; do
    echo
    echo "### $d"
    cat "$out/$d/report.md"
done
