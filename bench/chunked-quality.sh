#!/usr/bin/env bash
# Quality of chunked prefill against one-shot compression at the same budget (issue 12): the same items, methods and
# budgets through `ecokv eval`, once compressing after the whole prefill and once with --chunk N (compressing after
# every chunk). Accuracy is the dataset's metric; fidelity is teacher-forced on the full cache's answer (greedy
# agreement, mean KL). Sets:
#   vlm-multi   the tiny VLM's multi-image needle items (2-4 pages + distractor text), held-out seeds 200000..
#   vlm-read    the tiny VLM's transcription items ("Read all text.", character accuracy), seeds 100000..
#   niah        stories260K, --dataset niah, haystacks of up to 800 words (about 1900 tokens) (TinyStories-like filler)
#   stories     stories260K, --dataset niah with the bundled story (data/prompts/story.txt) as the haystack,
#               up to 700 words (about 1900 tokens): long story text, judged mostly by fidelity
# Question in the prompt (--mode prompt): the last chunk holds the question, as in a chat turn. A third run
# compresses in one shot without the question (--mode agnostic, the question asked after the compression): every
# chunk but the last is compressed without seeing the question, so this is the one-shot setting closest to it.
#
#   bash bench/chunked-quality.sh [OUT]            (default bench/results/chunked-quality)
#   LIMIT=10 bash bench/chunked-quality.sh /tmp/q  (first 10 items of each set: a quick check)
# Runs resume (ecokv eval keeps finished items). Tables: OUT/chunked-quality.md and .json.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/chunked-quality}
ecokv=build/bin/ecokv
py=/usr/bin/python3
methods=full,snapkv,snapkv+ecokv,pyramidkv+ecokv,madakv
limit=${LIMIT:-0}
threads=${THREADS:-1}
[ -x "$ecokv" ] || { echo "chunked-quality: build ecokv first (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$out/data"

[ -f "$out/data/multi/items.jsonl" ] || $py vlm/gen_docs.py --seed 200000 --count 100 --task multi --out "$out/data/multi" >/dev/null
[ -f "$out/data/read/items.jsonl" ] || $py vlm/gen_docs.py --seed 100000 --count 100 --task read --out "$out/data/read" >/dev/null
mkdir -p "$out/data/niah" "$out/data/stories"
echo '{"seed": 7, "count": 40, "context_words": 800, "n_lengths": 4, "n_depths": 5}' >"$out/data/niah/niah.json"
cp data/prompts/story.txt "$out/data/stories/story.txt"
echo '{"seed": 11, "count": 40, "context_words": 700, "n_lengths": 2, "n_depths": 5, "haystack_file": "story.txt"}' \
    >"$out/data/stories/niah.json"

run() {  # name chunk dataset-options...
    local name=$1 chunk=$2
    shift 2
    for c in 0 "$chunk" agnostic; do
        local dir="$out/$name-chunk$c" mode=prompt
        [ "$c" = agnostic ] && { dir="$out/$name-agnostic"; mode=agnostic; c=0; }
        echo "== $name, $mode, chunk $c" >&2
        "$ecokv" eval --methods "$methods" --mode "$mode" --limit "$limit" -t "$threads" --chunk "$c" "$@" --out "$dir"
        "$ecokv" report "$dir" >/dev/null
    done
}

vlm=(--model models/tiny-vlm.gguf --mmproj models/tiny-vlm-mmproj.gguf --dataset generated --window 8)
run vlm-multi 64 "${vlm[@]}" --data "$out/data/multi" --budgets 64,128,256 -n 12
run vlm-read 64 "${vlm[@]}" --data "$out/data/read" --budgets 32,64,128 -n 160 --metric chars
txt=(--model models/stories260K.gguf --dataset niah)
run niah 128 "${txt[@]}" --data "$out/data/niah" --budgets 64,128,256 -n 12
run stories 128 "${txt[@]}" --data "$out/data/stories" --budgets 64,128,256 -n 12

$py bench/chunked-quality.py "$out"
