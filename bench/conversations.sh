#!/usr/bin/env bash
# A 20-turn conversation about one page through ecokv serve (tests/server/conversation.mjs), three ways: the full
# cache, compressed once after the page and appended since, and compressed again after every answer
# (recompress_slack). Writes bench/results/conversations-MODEL.jsonl and prints the table of docs/conversations.md.
#   bench/conversations.sh [build/bin/ecokv]     (BUDGET=100 SLACK=32 TURNS=20 MODEL=tiny-qwen2vl)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ECOKV=${1:-$ROOT/build/bin/ecokv}
MODEL=${MODEL:-tiny-qwen2vl} BUDGET=${BUDGET:-100} SLACK=${SLACK:-32} TURNS=${TURNS:-20}
case $MODEL in
    tiny-qwen2vl) IMAGE=$ROOT/models/tiny-qwen2vl-sample/images/qa-240014.png ITEMS=$ROOT/models/tiny-qwen2vl-sample/items.jsonl ;;
    tiny-vlm) IMAGE=$ROOT/models/tiny-vlm-sample.png ITEMS= ;;
    *) echo "MODEL must be tiny-qwen2vl or tiny-vlm" >&2; exit 2 ;;
esac
DIR=$(mktemp -d)
"$ECOKV" serve --model "$ROOT/models/$MODEL.gguf" --mmproj "$ROOT/models/$MODEL-mmproj.gguf" --port 0 \
    --port-file "$DIR/port" --max-tokens 16 --cache-mib 1024 2> "$DIR/log" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
for _ in $(seq 300); do [[ -s "$DIR/port" ]] && break; sleep 0.1; done
URL=http://127.0.0.1:$(cat "$DIR/port")
OUT=$ROOT/bench/results/conversations-$MODEL.jsonl
mkdir -p "$(dirname "$OUT")"
: > "$OUT.part"
for mode in full appended recompressed; do
    case $mode in full) b=0 s=-1 ;; appended) b=$BUDGET s=-1 ;; recompressed) b=$BUDGET s=$SLACK ;; esac
    echo "$mode ..." >&2
    node "$ROOT/tests/server/conversation.mjs" "$URL" "$IMAGE" "$TURNS" "$b" "$s" "$MODEL" "$ITEMS" |
        python3 -c 'import json, sys
for line in sys.stdin:
    r = json.loads(line); r.update(mode=sys.argv[1], budget=int(sys.argv[2]), slack=int(sys.argv[3])); print(json.dumps(r))' \
            "$mode" "$b" "$s" >> "$OUT.part"
done
mv "$OUT.part" "$OUT"
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
by = {m: [r for r in rows if r["mode"] == m] for m in ("full", "appended", "recompressed")}
b, s = by["recompressed"][0]["budget"], by["recompressed"][0]["slack"]
print(f"| turn | cells of the turn | full: entries | appended: entries | re-compressed: entries | bound {b} + {s} + turn | "
      "correct full / appended / re-compressed |")
print("|---|---|---|---|---|---|---|")
mark = lambda r: "-" if r["correct"] is None else "yes" if r["correct"] else "no"
for f, a, c in zip(by["full"], by["appended"], by["recompressed"]):
    print(f"| {c['turn']} | {c['turn_cells']} | {f['entries_held']} | {a['entries_held']} | {c['entries_held']} | "
          f"{b + s + c['turn_cells']} | {mark(f)} / {mark(a)} / {mark(c)} |")
kib = lambda r: r["kv_bytes_kept"] / 1024
print(f"\nKV held after turn {len(by['full'])}: full {kib(by['full'][-1]):.1f} KiB, appended "
      f"{kib(by['appended'][-1]):.1f} KiB, re-compressed {kib(by['recompressed'][-1]):.1f} KiB; "
      f"re-compressions {sum(r['recompressions'] for r in by['recompressed'])}")
PY
