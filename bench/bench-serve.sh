#!/usr/bin/env bash
# Load test of ecokv serve on the bundled tiny VLM (bench/bench-serve.mjs, Node's fetch).
#   bench/bench-serve.sh [build/bin/ecokv] [seconds per point]     (SERVE_ARGS="-t 1": more server options; SLOTS=2)
# IMAGE (default models/tiny-vlm-sample.png) is the page of every request; for tiny-qwen2vl:
#   SERVE_ARGS="--model models/tiny-qwen2vl.gguf --mmproj models/tiny-qwen2vl-mmproj.gguf -b 100" \
#   IMAGE=models/tiny-qwen2vl-sample/images/qa-240014.png ROUNDS=2 bench/bench-serve.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ECOKV=${1:-$ROOT/build/bin/ecokv}
DIR=$(mktemp -d)
"$ECOKV" serve --port 0 --port-file "$DIR/port" --slots "${SLOTS:-2}" --queue 64 --cache-mib 1024 ${SERVE_ARGS:-} 2> "$DIR/log" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
for _ in $(seq 300); do [[ -s "$DIR/port" ]] && break; sleep 0.1; done
node "$ROOT/bench/bench-serve.mjs" "http://127.0.0.1:$(cat "$DIR/port")" "${IMAGE:-$ROOT/models/tiny-vlm-sample.png}" "${2:-10}"
