#!/usr/bin/env bash
# Long outputs on a text model (issue 31, docs/conversations.md): stories260K continues 24 story openings
# (bench/data/story-openings, written for this, no answers to score) for 256 tokens, the cache compressed to BUDGETS
# entries per head and again every N decoded cells (--decode-compress N; 0: never), against the full cache's story:
# chars of the compressed story against the full one's (ecokv metric), tokens, decode tokens/s.
#   bench/long-stories.sh [build/bin/ecokv] [OUT]   (BUDGETS=32,64 EVERY="0 8 32 128" WINDOW=4)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ECOKV=${1:-$ROOT/build/bin/ecokv}
OUT=${2:-$ROOT/bench/results/long-stories}
mkdir -p "$OUT"
for n in ${EVERY:-0 8 32 128}; do
    echo "== decode-compress $n" >&2
    rm -rf "$OUT/every-$n"
    "$ECOKV" eval --model "$ROOT/models/stories260K.gguf" --dataset generated --data "$ROOT/bench/data/story-openings" \
        --metric chars --methods full,snapkv+ecokv --budgets "${BUDGETS:-32,64}" --window "${WINDOW:-4}" \
        --decode-compress "$n" -n 256 -t 1 --out "$OUT/every-$n"
    rm -f "$OUT/every-$n/lock"
done
/usr/bin/python3 "$ROOT/vlm/long_outputs_table.py" "$OUT" "$ECOKV"
