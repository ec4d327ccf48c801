#!/usr/bin/env bash
# Several servers, one memory (issue 44): 3 ecokv serve replicas behind HAProxy round robin (deploy/cluster.sh), with
# and without the shared store, against one server, on 4-turn conversations about pages not seen before
# (bench/bench-vs-llama-server.mjs's unseen-4: held-out pages from vlm/gen_pages.py, QA seeds 0..399).
#
#   bench/bench-cluster.sh [seconds per point]     (default 20; ROUNDS=2, CLIENTS=6, BUDGET=100,
#                                                  OUT=bench/results/cluster.json)
#
# Rows, each on a fresh cluster (and an empty Redis), the order alternating by round:
#   one server       ecokv serve --slots 2, its own cache (what a conversation gets with session affinity)
#   3, round robin   3 replicas (--slots 2 each), no store: a turn that lands on another replica prefills the whole
#                    conversation again, image included
#   3, shared store  the same with --store: the turn resumes the conversation from Redis
# and, once, the store's entry sizes: the bytes of every stored entry, compressed (budget BUDGET) and --full.
# On this 2-core machine the replicas share the same cores: the rows compare what each turn costs (prefilled share,
# latency), not scale-out throughput.
set -euo pipefail
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_PER=${1:-20}
ROUNDS=${ROUNDS:-2}
CLIENTS=${CLIENTS:-6}
BUDGET=${BUDGET:-100}
MODEL=${MODEL:-$ROOT/models/tiny-qwen2vl.gguf}
MMPROJ=${MMPROJ:-$ROOT/models/tiny-qwen2vl-mmproj.gguf}
ECOKV=${ECOKV:-$ROOT/build/bin/ecokv}
OUT=${OUT:-$ROOT/bench/results/cluster.json}
DIR=$(mktemp -d)
trap 'bash "$ROOT/deploy/cluster.sh" stop --dir "$DIR/cluster" >/dev/null 2>&1; kill $(jobs -p) 2>/dev/null || true; rm -rf "$DIR"' EXIT
say() { echo "bench-cluster: $*" >&2; }
PORT=${PORT:-18180}
SERVE=(--model "$MODEL" --mmproj "$MMPROJ" --slots 2 -c 1024 -b "$BUDGET" --cache-mib 1024)

say "pages: vlm/gen_pages.py --seed 0 --count 400 --task qa --all-questions"
/usr/bin/python3 "$ROOT/vlm/gen_pages.py" --seed 0 --count 400 --task qa --all-questions --out "$DIR/pages" >/dev/null

point() {  # point ROW: one measurement on a fresh server or cluster, one JSON line
    local row=$1 url
    case "$row" in
        one-server)
            "$ECOKV" serve --port "$PORT" "${SERVE[@]}" 2> "$DIR/one.log" &
            local pid=$!
            for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
            url=http://127.0.0.1:$PORT ;;
        round-robin | shared-store)
            local flags=(--port "$PORT" --redis-port $((PORT + 100)) --dir "$DIR/cluster" --ecokv "$ECOKV")
            [[ $row == round-robin ]] && flags+=(--no-store)
            bash "$ROOT/deploy/cluster.sh" start "${flags[@]}" -- "${SERVE[@]}" >/dev/null
            url=http://127.0.0.1:$PORT ;;
    esac
    node "$ROOT/bench/bench-vs-llama-server.mjs" "$url" unseen-4 "$CLIENTS" "$SECONDS_PER" "$DIR/pages" \
        | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['row']='$row'; print(json.dumps(r))"
    if [[ $row == one-server ]]; then kill "$pid"; wait "$pid" 2>/dev/null || true
    else bash "$ROOT/deploy/cluster.sh" stop --dir "$DIR/cluster" >/dev/null; fi
}

entry_sizes() {  # entry_sizes LABEL SERVE_FLAGS...: the stored entries' bytes after 12 conversations
    local label=$1; shift
    bash "$ROOT/deploy/cluster.sh" start --port "$PORT" --redis-port $((PORT + 100)) --dir "$DIR/cluster" \
        --ecokv "$ECOKV" -- "${SERVE[@]}" "$@" >/dev/null
    node "$ROOT/bench/bench-vs-llama-server.mjs" "http://127.0.0.1:$PORT" unseen-4 1 3 "$DIR/pages" >/dev/null || true
    sleep 1
    local keys; keys=$(redis-cli -p $((PORT + 100)) --scan --pattern '*:e:*')
    local n=0 sum=0 max=0 b
    for k in $keys; do
        b=$(redis-cli -p $((PORT + 100)) STRLEN "$k"); n=$((n + 1)); sum=$((sum + b)); ((b > max)) && max=$b
    done
    bash "$ROOT/deploy/cluster.sh" stop --dir "$DIR/cluster" >/dev/null
    echo "{\"row\": \"entries-$label\", \"entries\": $n, \"mean_bytes\": $((sum / (n > 0 ? n : 1))), \"max_bytes\": $max}"
}

rows=(one-server round-robin shared-store)
: > "$DIR/points.jsonl"
for ((r = 0; r < ROUNDS; ++r)); do
    order=("${rows[@]}")
    ((r % 2)) && order=(shared-store round-robin one-server)
    for row in "${order[@]}"; do
        say "round $((r + 1)): $row, $CLIENTS clients, ${SECONDS_PER} s"
        point "$row" | tee -a "$DIR/points.jsonl" >&2
    done
done
say "entry sizes"
entry_sizes compressed >> "$DIR/points.jsonl"
entry_sizes full --full >> "$DIR/points.jsonl"
mkdir -p "$(dirname "$OUT")"
python3 - "$DIR/points.jsonl" "$OUT" <<'PY'
import json, os, sys
points = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2] + ".tmp", "w") as f:  # renamed whole: an interrupted run leaves the last result
    json.dump({"points": points}, f, indent=1)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
names = {"one-server": "one server (its own cache)", "round-robin": "3 replicas, round robin, no store",
         "shared-store": "3 replicas, round robin, shared store"}
print("| setup | turns/s (rounds) | p50 ms | later turns p50 ms | p99 ms | cached | failed |")
print("|---|---:|---:|---:|---:|---:|---:|")
def col(ps, fmt):
    return " / ".join(fmt(p) for p in ps)
for row, name in names.items():
    ps = [p for p in points if p["row"] == row]
    print("| %s | %s | %s | %s | %s | %s | %d |" % (
        name, col(ps, lambda p: "%.2f" % p["rps"]), col(ps, lambda p: "%.0f" % p["p50"]),
        col(ps, lambda p: "%.0f" % p["later_p50"]), col(ps, lambda p: "%.0f" % p["p99"]),
        col(ps, lambda p: "%.0f%%" % (100 * p["cached_share"])), sum(p["failed"] for p in ps)))
e = {p["row"]: p for p in points if p["row"].startswith("entries-")}
c, f = e["entries-compressed"], e["entries-full"]
print("\nstored entries: compressed %d of mean %.1f KiB (max %.1f), full %d of mean %.1f KiB (max %.1f): %.2fx smaller" % (
    c["entries"], c["mean_bytes"] / 1024, c["max_bytes"] / 1024, f["entries"], f["mean_bytes"] / 1024,
    f["max_bytes"] / 1024, f["mean_bytes"] / max(1, c["mean_bytes"])))
PY
