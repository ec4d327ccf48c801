#!/usr/bin/env bash
# The chat page at / of ecokv serve in a real browser (tests/server/page.mjs: Debian's chromium, headless, driven by
# puppeteer-core): a question about the sample receipt answered 64.02, compressed and full side by side; the
# heatmap's per-patch counts equal to the endpoint's (kv_kept), and the endpoint's equal to an independent count from
# `ecokv analyze --out` on the same prompt; one head's kept set; a huge image refused with the server's message; the
# API key asked for; no JavaScript errors; 1280x800 and a phone's width.
#   tests/server/test-page.sh path/to/ecokv        (SCREENSHOTS=DIR keeps the screenshots, e.g. docs/images)
set -euo pipefail
ECOKV=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=$(mktemp -d)
PIDS=()
trap 'rc=$?; [ $rc -eq 0 ] || for f in "$DIR"/*.log; do echo "--- $f"; tail -n 20 "$f"; done
      kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"' EXIT
command -v "${CHROMIUM:-chromium}" >/dev/null || { echo "chromium is missing: run scripts/setup.sh"; exit 1; }
[[ -d "$ROOT/tests/server/node_modules/puppeteer-core" ]] || { echo "puppeteer-core is missing: run scripts/setup.sh"; exit 1; }
MODEL=(--model "$ROOT/models/tiny-qwen2vl.gguf" --mmproj "$ROOT/models/tiny-qwen2vl-mmproj.gguf" -b 100)
IMAGE=$ROOT/models/tiny-qwen2vl-sample/images/qa-240014.png

start() {  # start NAME ARGS...: a server on a free port, its URL in $URL
    local name=$1; shift
    "$ECOKV" serve --port 0 --port-file "$DIR/$name.port" "${MODEL[@]}" "$@" 2> "$DIR/$name.log" &
    PIDS+=($!)
    for _ in $(seq 300); do [[ -s "$DIR/$name.port" ]] && break; sleep 0.1; done
    [[ -s "$DIR/$name.port" ]] || { echo "server $name did not start"; exit 1; }
    URL=http://127.0.0.1:$(cat "$DIR/$name.port")
}

# The independent count: analyze's kept share of every cell of the context the server compresses (the image, then
# the question) under the same method and budget.
"$ECOKV" analyze "${MODEL[@]}" --image "$IMAGE" -p "" --question "What is the TOTAL?" --out "$DIR/analysis" \
    --no-plots > "$DIR/analyze.log"
python3 "$ROOT/tests/support/make-images.py" "$DIR"
echo "page-key-$RANDOM" > "$DIR/key"
start main
main=$URL
start keyed --api-key-file "$DIR/key"
node "$ROOT/tests/server/page.mjs" "$main" "$URL" "$(cat "$DIR/key")" "$IMAGE" "$DIR/analysis/analysis.json" \
    "$DIR/huge.png" "${SCREENSHOTS:-$DIR}"
