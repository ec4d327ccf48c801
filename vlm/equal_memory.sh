#!/usr/bin/env bash
# Eviction against a smaller image at equal KV memory (issue 33, part 2), on tiny-qwen2vl's held-out QA pages:
#   (a) the full cache of the page resized by mtmd to at most N image tokens (--image-max-tokens N, the baseline a
#       user short of memory picks), N in 50 100 200 300 and the native page;
#   (b) ECOKV, MixKV, SnapKV, ManifoldKV and SparseMM + ECOKV on the native page at budgets 50 100 200 300;
#   (c) both at once: the page resized to about twice the budget, then SnapKV + ECOKV to the budget (for budgets
#       whose doubled image is below the pages' 400-576 tokens: 50 100 200; at 300 it would be the native page);
# in both protocols (question-agnostic: compressed before the question; prompt: the question in the window), at one
# observation window ($WINDOW, 8) for every method. Then vlm/equal_memory_plot.py draws accuracy against KV
# entries per head (both curves) and writes the table.
#
#   bash vlm/equal_memory.sh [PREFIX] [OUT]    (defaults: models/tiny-qwen2vl, vlm/runs/equal-memory)
#   LIMIT=20 bash vlm/equal_memory.sh ...      (the first 20 items: a quick check)
#   THREADS=1 (default)                        (ecokv eval's threads)
#
# Held-out QA seeds 0..499 of vlm/gen_pages.py (training uses >= 1,000,000; 250,000-999,999 are reserved). Every
# run resumes where it stopped (ecokv eval's results.jsonl); the figures go to OUT/equal-memory.{md,csv,png}.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-models/tiny-qwen2vl}
out=${2:-vlm/runs/equal-memory}
ecokv=build/bin/ecokv
py=/usr/bin/python3
window=${WINDOW:-8}
threads=${THREADS:-1}
budgets=(50 100 200 300)
methods=snapkv+ecokv,snapkv+mixkv,snapkv,manifoldkv,sparsemm+ecokv

[ -x "$ecokv" ] || { echo "equal_memory: build ecokv first (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$out"
[ -f "$out/data/qa/items.jsonl" ] || $py vlm/gen_pages.py --seed 0 --count 500 --task qa --out "$out/data/qa"

eval_run() {  # mode dir [options]: one ecokv eval of the QA set
    local mode=$1 dir=$2
    shift 2
    echo "== $dir" >&2
    "$ecokv" eval --model "$prefix.gguf" --mmproj "$prefix-mmproj.gguf" --dataset generated --data "$out/data/qa" \
        --mode "$mode" -n 12 --limit "${LIMIT:-0}" -t "$threads" --head-scores "$prefix-head-scores.json" \
        --window "$window" "$@" --out "$out/$dir"
}

budget_list=$(IFS=,; echo "${budgets[*]}")
for mode in agnostic prompt; do
    eval_run $mode "$mode-methods" --methods "full,$methods" --budgets "$budget_list"
    for n in "${budgets[@]}"; do
        eval_run $mode "$mode-image-$n" --methods full --budgets "$n" --image-max-tokens "$n"
        # (c): the image at about twice the budget (its text cells aside), then eviction to the budget
        [ $((2 * n)) -lt 500 ] || continue
        eval_run $mode "$mode-both-$n" --methods snapkv+ecokv --budgets "$n" --image-max-tokens $((2 * n))
    done
done
$py vlm/equal_memory_plot.py "$out"
