#!/usr/bin/env bash
# ecokv serve against upstream llama-server, same model, same pages, same machine (issue 43).
#
#   bench/bench-vs-llama-server.sh [seconds per point]        (default 10; ROUNDS=2, BUDGET=100, ROWS: see below,
#                                                             OUT=bench/results/vs-llama-server.json)
#
# 1. Builds llama-server once from the pinned llama.cpp tree, unpatched (the bundle scripts/fetch-llama.sh keeps), into
#    build-peer/ (git-ignored; never part of setup or the default build) at llama.cpp's own defaults, Release: its ggml
#    is built for this CPU (GGML_NATIVE=ON, -march=native), while ecokv's default build is portable
#    (ECOKV_LLAMA_NATIVE=OFF). The kernels differ (AVX-512 against AVX2 on this machine's Xeon): for equal kernels, build
#    ecokv natively (cmake -B build-native -DECOKV_LLAMA_NATIVE=ON; ECOKV=build-native/bin/ecokv). Both builds' choice
#    is printed and kept in the JSON.
# 2. Renders held-out pages (vlm/gen_pages.py, QA seeds 0..399, every field's question).
# 3. Checks that both servers see the same prompt (the same prompt tokens; llama-server renders ecokv's plain chat
#    format through bench/peer/plain-chat.jinja) and compares their answers: ecokv's full cache must answer as
#    llama-server does; the compressed one is shown.
# 4. Runs every row on fresh servers, ecokv and llama-server one after the other (which goes first alternates by
#    round), ROUNDS times: requests/s, p50/p99, the share of prompt tokens served from cache, server CPU seconds
#    per wall second, and the KV bytes each holds. Writes bench/results/vs-llama-server.json and prints the table.
#
# Setup (SETUP=slots, issue 43's): tiny-qwen2vl (MODEL, MMPROJ), 2 slots each: `ecokv serve --slots 2 -c 1024 -b
# BUDGET` and `llama-server -np 2 -c 2048` (1024 cells a slot either way). SETUP=pool (issue 50's): the same KV memory
# shared by all live sequences, `ecokv serve --slots SLOTS -c CTX` (default 16 and 4096; the decode loop's pool) and
# llama-server as its auto default runs, 4 slots sharing one pool, `-np 4 -kvu -c CTX`. Threads by each server's default
# (the physical cores), conversation caches of 1024 MiB (`--cache-mib` / `--cache-ram`) except in the equal-memory row
# (4 MiB); answers of MAX_TOKENS tokens (default 12, ignore_eos).
# ROWS (default all): a comma list of one-page-1, one-page-8, unseen-1, unseen-8, unseen-16, recurring-8, memory-16,
# memory-served-16 (the same, llama-server given an HTTP thread for every client: see below) and full-unseen-1 (ecokv
# with --full: full caches against llama-server's). ECOKV_ARGS: more options for every ecokv server (--no-batch).
# PEER_LD_PRELOAD: a library llama-server loads first, e.g. ecokv's build-native/bin/libggml-cpu.so.0, to give it
# patch 0005's aligned work buffer (patches/llama.cpp/README.md) and compare the servers with the same kernels.
set -euo pipefail
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_PER=${1:-10}
ROUNDS=${ROUNDS:-2}
BUDGET=${BUDGET:-100}
MODEL=${MODEL:-$ROOT/models/tiny-qwen2vl.gguf}
MMPROJ=${MMPROJ:-$ROOT/models/tiny-qwen2vl-mmproj.gguf}
ECOKV=${ECOKV:-$ROOT/build/bin/ecokv}
SETUP=${SETUP:-slots}
CTX=${CTX:-4096}
SLOTS=${SLOTS:-16}
export MAX_TOKENS=${MAX_TOKENS:-12}
case $SETUP in
    slots) ECOKV_MEMORY=(--slots 2 -c 1024) PEER_MEMORY=(-np 2 -c 2048) ;;
    pool) ECOKV_MEMORY=(--slots "$SLOTS" -c "$CTX") PEER_MEMORY=(-np 4 -kvu -c "$CTX") ;;
    *) echo "bench-vs-llama-server: SETUP is slots or pool" >&2; exit 2 ;;
esac
PEER=$ROOT/build-peer
LLAMA_SERVER=$PEER/build/bin/llama-server
ROWS=${ROWS:-one-page-1,one-page-8,unseen-1,unseen-8,unseen-16,recurring-8,memory-16,memory-served-16,full-unseen-1}
DIR=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$DIR"' EXIT
say() { echo "bench-vs-llama-server: $*" >&2; }

build_peer() {
    [[ -x $LLAMA_SERVER ]] && return
    bash "$ROOT/scripts/fetch-llama.sh" >&2   # keeps the bundle in third_party/npm
    local bundle commit
    bundle=$(ls "$ROOT"/third_party/npm/node-llama-cpp@*/gitRelease.bundle)
    commit=$(sed -n 's/^commit=//p' "$ROOT/third_party/llama.cpp/.ecokv-fetch-stamp")
    say "building llama-server from $commit, unpatched, into $PEER (once; ~15 min on 2 cores)"
    rm -rf "$PEER/src"
    mkdir -p "$PEER"
    git -c advice.detachedHead=false clone -q "$bundle" "$PEER/src"
    [[ $(git -C "$PEER/src" rev-parse HEAD) == "$commit" ]] || { say "the bundle is not at $commit"; exit 1; }
    # No UI download (there is no internet) and no HTTPS; otherwise llama.cpp's own defaults, Release as ours.
    cmake -S "$PEER/src" -B "$PEER/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_APP=OFF >"$PEER/configure.log"
    cmake --build "$PEER/build" -j"$(nproc)" --target llama-server >"$PEER/build.log"
}

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start SERVER CACHE_MIB [extra options]: starts it, sets PID and URL, waits until it answers /health.
start() {
    local server=$1 cache=$2; shift 2
    local port
    port=$(free_port)
    if [[ $server == ecokv ]]; then
        "$ECOKV" serve --model "$MODEL" --mmproj "$MMPROJ" --port "$port" "${ECOKV_MEMORY[@]}" --queue 64 \
            -b "$BUDGET" --cache-mib "$cache" --max-tokens "$MAX_TOKENS" ${ECOKV_ARGS:-} "$@" 2>"$DIR/$server.log" &
    else
        LD_PRELOAD=${PEER_LD_PRELOAD:-} LLAMA_MEDIA_MARKER='<__media__>' "$LLAMA_SERVER" -m "$MODEL" --mmproj "$MMPROJ" --host 127.0.0.1 \
            --port "$port" "${PEER_MEMORY[@]}" --jinja --chat-template-file "$ROOT/bench/peer/plain-chat.jinja" \
            --cache-ram "$cache" -n "$MAX_TOKENS" --no-warmup -lv 4 "$@" >"$DIR/$server.log" 2>&1 &
    fi
    PID=$! URL=http://127.0.0.1:$port
    for _ in $(seq 600); do
        curl -sf "$URL/health" >/dev/null 2>&1 && return
        kill -0 "$PID" 2>/dev/null || { tail -20 "$DIR/$server.log" >&2; say "$server did not start"; exit 1; }
        sleep 0.1
    done
    say "$server did not answer /health in 60 s"; exit 1
}

# The KV bytes a server holds at the end of a run: ecokv's kept entries (its /metrics) and its live sequences
# (at most -c cells a slot); llama-server's slots (the size it logs) and its prompt cache (its trace log, -lv 4).
kv_note() {
    if [[ $1 == ecokv ]]; then
        curl -s "$URL/metrics" | awk '$1 == "ecokv_kv_cache_bytes" { b = $2 } $1 == "ecokv_kv_cache_conversations" { c = $2 }
            $1 == "ecokv_kv_cache_prefixes" { p = $2 } END { printf "kept %.3f MiB in %d conversations, %d prefixes", b / 1048576, c, p }'
    else
        local live kept
        live=$(sed -n 's/.*llama_kv_cache: size = *\([0-9.]*\) MiB.*/\1/p' "$DIR/$1.log" | head -1)
        kept=$(sed -n 's/.*cache state: \([0-9]*\) prompts, \([0-9.]*\) MiB.*/\2 MiB in \1 prompts/p' "$DIR/$1.log" | tail -1)
        echo "slots $live MiB, prompt cache ${kept:-empty}"
    fi
}

# point SERVER WORKLOAD CLIENTS CACHE_MIB ROUND ROW [server options]: one measurement on a fresh server, a JSON line
# appended.
point() {
    local server=$1 workload=$2 clients=$3 cache=$4 round=$5 row=$6
    shift 6
    start "$server" "$cache" "$@"
    local cpu0 cpu1 rc=0
    cpu0=$(awk '{print $14 + $15}' "/proc/$PID/stat")
    node "$ROOT/bench/bench-vs-llama-server.mjs" "$URL" "$workload" "$clients" "$SECONDS_PER" "$DIR/pages" \
        >"$DIR/out.json" || rc=$?
    cpu1=$(awk '{print $14 + $15}' "/proc/$PID/stat")
    local note
    note=$(kv_note "$server")
    kill "$PID"; wait "$PID" 2>/dev/null || true
    [[ $rc -eq 0 ]] || { cat "$DIR/out.json" >&2; say "$server $workload failed or ran out of pages"; exit 1; }
    /usr/bin/python3 - "$DIR/out.json" "$server" "$row" "$round" "$cache" "$cpu0" "$cpu1" "$note" \
        >>"$DIR/all.jsonl" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d.update(server=sys.argv[2], row=sys.argv[3], round=int(sys.argv[4]), cache_mib=int(sys.argv[5]),
         cpu_per_wall=(int(sys.argv[7]) - int(sys.argv[6])) / 100 / d["seconds"], kv=sys.argv[8])
print(json.dumps(d))
PY
    say "$(tail -1 "$DIR/all.jsonl" | cut -c1-200)"
}

build_peer
native_of() { sed -n "s/^$2:BOOL=//p" "$1/CMakeCache.txt" 2>/dev/null | head -1; }  # native_of BUILD_DIR VARIABLE
ECOKV_NATIVE=$(native_of "$(dirname "$(dirname "$ECOKV")")" ECOKV_LLAMA_NATIVE) PEER_NATIVE=$(native_of "$PEER/build" GGML_NATIVE)
say "ggml built for this CPU (GGML_NATIVE): ecokv ${ECOKV_NATIVE:-?}, llama-server ${PEER_NATIVE:-?}"
echo "{\"ecokv\": \"${ECOKV_NATIVE:-?}\", \"llama_server\": \"${PEER_NATIVE:-?}\"}" > "$DIR/native.json"
echo "{\"setup\": \"$SETUP\", \"ecokv\": \"${ECOKV_MEMORY[*]}\", \"llama_server\": \"${PEER_MEMORY[*]}\", \"max_tokens\": $MAX_TOKENS}" \
    > "$DIR/setup.json"
say "setup $SETUP: ecokv ${ECOKV_MEMORY[*]}, llama-server ${PEER_MEMORY[*]}, answers of $MAX_TOKENS tokens"
say "pages: vlm/gen_pages.py --seed 0 --count 400 --task qa --all-questions"
/usr/bin/python3 "$ROOT/vlm/gen_pages.py" --seed 0 --count 400 --task qa --all-questions --out "$DIR/pages" >/dev/null

# The check: one client, the first 8 pages' first questions.
for server in ecokv-full ecokv llama; do
    case $server in ecokv-full) start ecokv 1024 --full ;; *) start "$server" 1024 ;; esac
    node "$ROOT/bench/bench-vs-llama-server.mjs" "$URL" check 1 60 "$DIR/pages" >"$DIR/check-$server.json"
    kill "$PID"; wait "$PID" 2>/dev/null || true
done

for round in $(seq "$ROUNDS"); do
    order=(ecokv llama)
    (( round % 2 == 0 )) && order=(llama ecokv)
    for row in ${ROWS//,/ }; do
        case $row in
            one-page-*) workload=one-page cache=1024 ;;
            unseen-*|full-unseen-*) workload=unseen cache=1024 ;;
            recurring-*) workload=recurring cache=1024 ;;
            memory-*) workload=unseen-4 cache=4 ;;
            *) say "unknown row $row"; exit 2 ;;
        esac
        clients=${row##*-}
        # llama-server answers on n_parallel + 4 HTTP threads by default, each holding a keep-alive connection: past
        # that, clients wait to be accepted. memory-served-* gives it a thread for every client.
        peer_options=() ecokv_options=()
        [[ $row == memory-served-* ]] && peer_options=(--threads-http $((clients + 4)))
        [[ $row == full-* ]] && ecokv_options=(--full)
        for server in "${order[@]}"; do
            if [[ $server == llama ]]; then
                point "$server" "$workload" "$clients" "$cache" "$round" "$row" ${peer_options[@]+"${peer_options[@]}"}
            else
                point "$server" "$workload" "$clients" "$cache" "$round" "$row" ${ecokv_options[@]+"${ecokv_options[@]}"}
            fi
        done
    done
done

mkdir -p "$ROOT/bench/results"
/usr/bin/python3 "$ROOT/bench/bench-vs-llama-server-table.py" "$DIR" "${OUT:-$ROOT/bench/results/vs-llama-server.json}" \
    "$SECONDS_PER" "$BUDGET"
