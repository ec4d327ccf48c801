#!/usr/bin/env bash
# The server's chunked prefill on the device, N times (docs/gpu.md: the pattern that crashed on lavapipe before patch
# 0003): ecokv serve -ngl 99, each request two pages it has not seen (the sample with its number drawn in, so no prefix
# entry hits) prefilled in chunks of 64 (kv_compression.chunk), compressed to 64 a head, 16 answer tokens. Prints how
# many answered 200, and fails if any did not or the server died.
#   tests/gpu/chunked-loop.sh [build-vulkan/bin/ecokv] [N=200]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ECOKV=${1:-$ROOT/build-vulkan/bin/ecokv}
N=${2:-200}
DIR=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$DIR"' EXIT
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
/usr/bin/python3 - "$ROOT/models/tiny-vlm-sample.png" "$DIR" "$N" <<'PY'
import base64, io, json, sys
from PIL import Image, ImageDraw
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
base = Image.open(src).convert("RGB")
def page(i):
    im = base.copy()
    ImageDraw.Draw(im).text((2, 2), str(i), fill=(255 - i % 97, i % 89, 40))
    b = io.BytesIO(); im.save(b, "PNG")
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b.getvalue()).decode()}}
for i in range(n):
    body = {"max_tokens": 16, "kv_compression": {"chunk": 64, "budget": 64, "window": 8},
            "messages": [{"role": "user", "content": [page(2 * i), page(2 * i + 1), {"type": "text", "text": "What is the TOTAL?"}]}]}
    json.dump(body, open(f"{out}/{i}.json", "w"))
PY
"$ECOKV" serve -ngl 99 --port 0 --port-file "$DIR/port" 2> "$DIR/log" &
pid=$!
for _ in $(seq 600); do [[ -s "$DIR/port" ]] && break; sleep 0.1; done
ok=0
for i in $(seq 0 $((N - 1))); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
        --data-binary "@$DIR/$i.json" "http://127.0.0.1:$(cat "$DIR/port")/v1/chat/completions" || true)
    [[ "$code" == 200 ]] && ok=$((ok + 1))
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "chunked-loop: the server died at request $((i + 1)) of $N:"; tail -5 "$DIR/log"; exit 1
    fi
    (( (i + 1) % 20 == 0 )) && echo "chunked-loop: $((i + 1)) sent, $ok answered 200"
done
echo "chunked-loop: $ok of $N chunked requests answered 200, the server alive"
[[ $ok == "$N" ]]
