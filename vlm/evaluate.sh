#!/usr/bin/env bash
# Evaluate a tiny VLM export through llama.cpp (ecokv eval) on its held-out sets, in two protocols, with the fair
# baselines and both SPEC §5.2 readings:
#   paper  every method at its paper's observation window (the registry defaults: 32 for SnapKV, MixKV, the
#          allocators' SnapKV, ManifoldKV, KeyDiff; 4 for ECOKV and StreamingLLM), at the budgets above 32;
#   equal  every method at one window ($WINDOW, 8), at every budget; plus MixKV with --mixkv-scale importance,
#          ECOKV with --ecokv-weights figure3, and (dynamic-resolution models) the smaller-image baseline: the full
#          cache of the page resized to at most B tokens (--image-max-tokens B), in budget B's column.
# Tables: ecokv report, with the standard error of every score and paired differences against snapkv+mixkv.
#
#   bash vlm/evaluate.sh [PREFIX] [OUT]      (defaults: models/tiny-vlm, vlm/runs/eval-<name of PREFIX>)
#   LIMIT=20 bash vlm/evaluate.sh ...        (only the first 20 items of each set: a quick check)
#   SETS="qa-agnostic qa-prompt" ...         (a subset of: qa-agnostic qa-prompt read-agnostic multi-agnostic)
#   THREADS=2 ...                            (ecokv eval's threads; 1 by default: on models this small, syncing
#                                             threads at every op costs more than the op, up to 20x beside training)
#
# The model decides the generator and budgets: a qwen2vl_merger projector is tiny-qwen2vl (vlm/gen_pages.py, about
# 500 tokens a page, budgets 50/100/200), otherwise tiny-vlm (vlm/gen_docs.py, 147 tokens, budgets 16/32/64; its
# LLaVA projector resizes every image to 96x96, so it has no smaller-image baseline). Held-out seeds (training uses
# >= 1,000,000; 250,000-999,999 are reserved): QA 0..499, transcription 100000..100099, multi-image
# 200000..200099. sparsemm+ecokv reads PREFIX-head-scores.json (vlm/head_scores.py). Results: OUT/<set>-<run>/,
# tables in OUT/<set>-{paper,equal}.md.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-models/tiny-vlm}
name=$(basename "$prefix")
out=${2:-vlm/runs/eval-$name}
ecokv=build/bin/ecokv
py=/usr/bin/python3
window=${WINDOW:-8}
threads=${THREADS:-1}
sets=${SETS:-qa-agnostic qa-prompt read-agnostic multi-agnostic}
methods=snapkv,snapkv+mixkv,snapkv+ecokv,pyramidkv+ecokv,adakv+ecokv,sparsemm+ecokv,madakv,manifoldkv,keydiff,lookm,streamingllm

[ -x "$ecokv" ] || { echo "evaluate: build ecokv first (scripts/setup.sh)" >&2; exit 1; }
[ -f "$prefix-head-scores.json" ] || { echo "evaluate: $prefix-head-scores.json missing (vlm/head_scores.py)" >&2; exit 1; }
projector=$($py -c "
import sys; sys.path.insert(0, 'third_party/llama.cpp/gguf-py'); import gguf
f = gguf.GGUFReader(sys.argv[1]).fields['clip.projector_type']; print(bytes(f.parts[f.data[0]]).decode())" "$prefix-mmproj.gguf")
if [ "$projector" = qwen2vl_merger ]; then
    gen=vlm/gen_pages.py budgets=50,100,200 paper_budgets=50,100,200 smaller=1
else
    gen=vlm/gen_docs.py budgets=16,32,64 paper_budgets=64 smaller=0
fi
mkdir -p "$out"
[ -f "$out/data/qa/items.jsonl" ] || $py $gen --seed 0 --count 500 --task qa --out "$out/data/qa"
[ -f "$out/data/read/items.jsonl" ] || $py $gen --seed 100000 --count 100 --task read --out "$out/data/read"
[ -f "$out/data/multi/items.jsonl" ] || $py $gen --seed 200000 --count 100 --task multi --out "$out/data/multi"

eval_run() {  # data mode n_predict dir [options]: one ecokv eval, then its report
    local data=$1 mode=$2 n=$3 dir=$4
    shift 4
    echo "== $dir" >&2
    "$ecokv" eval --model "$prefix.gguf" --mmproj "$prefix-mmproj.gguf" --dataset generated --data "$out/data/$data" \
        --mode "$mode" -n "$n" --limit "${LIMIT:-0}" -t "$threads" --head-scores "$prefix-head-scores.json" "$@" --out "$out/$dir"
}

for set in $sets; do
    data=${set%-*} mode=${set#*-}
    n=12 metric=()
    [ "$data" = read ] && n=160 metric=(--metric chars)
    eval_run "$data" "$mode" $n "$set-paper" --methods "full,$methods" --budgets $paper_budgets "${metric[@]}"
    eval_run "$data" "$mode" $n "$set-equal" --methods "full,$methods" --budgets $budgets --window "$window" "${metric[@]}"
    equal=("$out/$set-equal")
    if [ "$data" != multi ]; then
        eval_run "$data" "$mode" $n "$set-mixkv-importance" --methods snapkv+mixkv --budgets $budgets --window "$window" \
            --mixkv-scale importance "${metric[@]}"
        eval_run "$data" "$mode" $n "$set-ecokv-figure3" --methods snapkv+ecokv --budgets $budgets --window "$window" \
            --ecokv-weights figure3 "${metric[@]}"
        equal+=("$out/$set-mixkv-importance" "$out/$set-ecokv-figure3")
        if [ $smaller = 1 ]; then
            for b in ${budgets//,/ }; do
                eval_run "$data" "$mode" $n "$set-image-$b" --methods full --budgets "$b" --image-max-tokens "$b" "${metric[@]}"
                equal+=("$out/$set-image-$b")
            done
        fi
    fi
    "$ecokv" report "$out/$set-paper" --out "$out/$set-paper" >/dev/null
    "$ecokv" report "${equal[@]}" --tag window,mixkv_scale,ecokv_weights --out "$out/$set-equal" >/dev/null
done
for set in $sets; do
    for protocol in paper equal; do
        echo
        echo "### $set, $protocol windows"
        cat "$out/$set-$protocol.md"
    done
done
