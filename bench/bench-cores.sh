#!/usr/bin/env bash
# A lone request on all the cores (issue 43): ecokv serve --slots 2 where every request brings a page the server has
# not seen (image prefill, compression, 12 answer tokens), at 1, 2 and 8 clients (CLIENTS), for three ways of giving
# out threads, interleaved ROUNDS times on one machine (it is shared: compare neighbours):
#   static   -t N/slots (each context a fixed share of the cores: what -t 0 meant before)
#   shared   -t 0 (the cores divided among the requests running now: a lone request has them all)
#   1 slot   --slots 1 -t 0 (one request at a time on every core)
#   bench/bench-cores.sh [build/bin/ecokv] [seconds per point]    (IMAGE: the page varied; SERVE_ARGS: more options)
# Prints a table and writes bench/results/cores.json.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ECOKV=${1:-$ROOT/build/bin/ecokv}
SECONDS_PER=${2:-10}
export CLIENTS=${CLIENTS:-1,2,8}  # concurrent clients, a point each
DIR=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$DIR"' EXIT
cores=$(nproc)
static=$(( cores / 2 > 0 ? cores / 2 : 1 ))
# 600 pages, each the image with its number written in the corner: distinct bytes, so no request hits another's entry.
/usr/bin/python3 - "${IMAGE:-$ROOT/models/tiny-vlm-sample.png}" "$DIR/pages" <<'PY'
import os, sys
from PIL import Image, ImageDraw
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
base = Image.open(src).convert("RGB")
for i in range(600):
    im = base.copy()
    ImageDraw.Draw(im).text((2, 2), str(i), fill=(255 - i % 97, i % 89, 40))
    im.save(f"{out}/{i:04d}.png")
PY
run() {  # name, server options...
    local name=$1; shift
    rm -f "$DIR/port"
    "$ECOKV" serve --port 0 --port-file "$DIR/port" --queue 64 "$@" ${SERVE_ARGS:-} 2> "$DIR/log" &
    local pid=$!
    for _ in $(seq 300); do [[ -s "$DIR/port" ]] && break; sleep 0.1; done
    local t0 cpu0 cpu1
    cpu0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    PAGES="$DIR/pages" node "$ROOT/bench/bench-serve.mjs" "http://127.0.0.1:$(cat "$DIR/port")" - "$SECONDS_PER" \
        > "$DIR/out.json"
    cpu1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    kill "$pid"; wait "$pid" 2>/dev/null || true
    /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["name"]=sys.argv[2]; d["round"]=int(sys.argv[3]); d["cpu_s"]=(int(sys.argv[5])-int(sys.argv[4]))/100; print(json.dumps(d))' \
        "$DIR/out.json" "$name" "$round" "$cpu0" "$cpu1" >> "$DIR/all.jsonl"
}
for round in $(seq "${ROUNDS:-2}"); do
    run "static (-t $static each)" --slots 2 -t "$static"
    run "shared (-t 0)" --slots 2
    run "1 slot (-t 0)" --slots 1
done
mkdir -p "$ROOT/bench/results"
/usr/bin/python3 - "$DIR/all.jsonl" "$ROOT/bench/results/cores.json" "$SECONDS_PER" "$cores" <<'PY'
import json, os, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2] + ".tmp", "w") as f:  # renamed into place: an interrupted run leaves the last results whole
    json.dump({"seconds_per_point": float(sys.argv[3]), "cores": int(sys.argv[4]), "runs": runs}, f, indent=1)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
print(f"| round | threads | clients | requests/s | p50 ms | p99 ms | prefix hits | vs static | server CPU s / wall s |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for r in runs:
    wall = len(r["rows"]) * float(sys.argv[3])
    for row in r["rows"]:
        base = next(x for x in runs if x["round"] == r["round"] and x["name"].startswith("static"))
        b = next(x for x in base["rows"] if x["clients"] == row["clients"])
        print(f"| {r['round']} | {r['name']} | {row['clients']} | {row['rps']:.2f} | {row['p50']:.0f} | {row['p99']:.0f} | "
              f"{row['hits']} | {row['rps'] / b['rps']:.2f}x | {r['cpu_s'] / wall:.2f} |")
PY
