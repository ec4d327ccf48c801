#!/usr/bin/env bash
# Quantized KV caches under eviction on tiny-qwen2vl (docs/quantized-kv.md): question-agnostic QA on 500 held-out
# pages (vlm/gen_pages.py seeds 0..499), {f16, q8_0, q4_0} K and V x {full, snapkv, snapkv+mixkv, snapkv+ecokv} at
# budgets 200/100/50, at window 8 (equal) and at the paper's windows (registry defaults), flash attention on for
# every type (a quantized V needs it). Each run is one ecokv eval directory (resumable: eval skips finished items);
# the table is vlm/quantized_kv_table.py's.
#
#   bash vlm/quantized_kv.sh [OUT]        (default vlm/runs/quantized)
#   LIMIT=20 bash vlm/quantized_kv.sh     (a quick check)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-vlm/runs/quantized}
prefix=models/tiny-qwen2vl
py=/usr/bin/python3
[ -x build/bin/ecokv ] || { echo "quantized_kv: build ecokv first (scripts/setup.sh)" >&2; exit 1; }
[ -f "$out/data/qa/items.jsonl" ] || $py vlm/gen_pages.py --seed 0 --count 500 --task qa --out "$out/data/qa"
for type in f16 q8_0 q4_0; do
    for protocol in equal paper; do
        window=()
        [ $protocol = equal ] && window=(--window 8)
        echo "== $type $protocol" >&2
        build/bin/ecokv eval --model "$prefix.gguf" --mmproj "$prefix-mmproj.gguf" --dataset generated \
            --data "$out/data/qa" --mode agnostic -n 12 --limit "${LIMIT:-0}" -t 1 -fa on -ctk $type -ctv $type \
            --methods full,snapkv,snapkv+mixkv,snapkv+ecokv --budgets 200,100,50 "${window[@]}" \
            --out "$out/$type-$protocol"
    done
done
# Written beside and renamed into place: an interrupted run leaves the previous table, never half of one.
$py vlm/quantized_kv_table.py "$out" > "$out/table.md.tmp"
mv "$out/table.md.tmp" "$out/table.md"
cat "$out/table.md"
