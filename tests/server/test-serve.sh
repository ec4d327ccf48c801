#!/usr/bin/env bash
# ecokv serve end to end on the bundled tiny VLM: the official openai client (clients.mjs), curl for bad inputs
# (each a 4xx with an OpenAI error body, and the next request served), a full server refusing with 503, metrics.
#   tests/server/test-serve.sh path/to/ecokv
set -euo pipefail
ECOKV=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=$(mktemp -d)
PIDS=()
# On failure the servers' logs are shown (an abort's message is there), then everything is cleaned up.
trap 'rc=$?; [ $rc -eq 0 ] || for f in "$DIR"/*.log; do echo "--- $f"; tail -n 40 "$f"; done
      kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"' EXIT
[[ -d "$ROOT/tests/server/node_modules/openai" ]] || { echo "missing npm clients: run scripts/setup.sh"; exit 1; }

start() {  # start NAME ARGS...: a server on a free port, its URL in $URL
    local name=$1; shift
    # shellcheck disable=SC2086  # SERVE_ARGS: engine flags for every server (scripts/test-gpu.sh: -ngl 99)
    "$ECOKV" serve --port 0 --port-file "$DIR/$name.port" ${SERVE_ARGS:-} "$@" 2> "$DIR/$name.log" &
    PIDS+=($!)
    for _ in $(seq 300); do [[ -s "$DIR/$name.port" ]] && break; sleep 0.1; done
    [[ -s "$DIR/$name.port" ]] || { cat "$DIR/$name.log"; echo "server $name did not start"; exit 1; }
    URL=http://127.0.0.1:$(cat "$DIR/$name.port")
}

start main --slots 2 --queue 8 --max-tokens 16
node "$ROOT/tests/server/clients.mjs" "$URL" "$ROOT/models/tiny-vlm-sample.png"

# Compress once, ask many: kept contexts (prefix entries), against the same server keeping nothing and a 1 MiB cache.
main_url=$URL
/usr/bin/python3 "$ROOT/tests/support/page-variants.py" "$ROOT/models/tiny-vlm-sample.png" 13 "$DIR"
start fresh --slots 2 --max-tokens 16 --cache-mib 0
fresh_url=$URL
start small --slots 2 --max-tokens 16 --cache-mib 1
node "$ROOT/tests/server/prefixes.mjs" "$main_url" "$fresh_url" "$URL" "$DIR"
URL=$main_url

expect() {  # expect STATUS NAME BODY: POST BODY, check the status and that the error body names a message
    local status body
    status=$(curl -s -o "$DIR/out" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$3" \
             "$URL/v1/chat/completions")
    body=$(cat "$DIR/out")
    if [[ "$status" != "$1" ]] || { [[ "$1" != 200 ]] && ! grep -q '"error":{' "$DIR/out"; }; then
        echo "not ok - $2: HTTP $status, expected $1: $body"; exit 1
    fi
    echo "ok - $2 ($status)"
}
png=$(base64 -w0 "$ROOT/models/tiny-vlm-sample.png")
img() { echo "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,$1\"}},{\"type\":\"text\",\"text\":\"What is the TOTAL?\"}]}]}"; }
expect 400 "malformed JSON" '{"messages": ['
expect 400 "not an object" '[1, 2]'
expect 400 "messages of the wrong type" '{"messages": "hi"}'
expect 400 "empty messages" '{"messages": []}'
expect 400 "content of the wrong type" '{"messages": [{"role": "user", "content": 5}]}'
expect 400 "unknown role" '{"messages": [{"role": "wizard", "content": "hi"}]}'
expect 404 "unknown model" '{"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}'
expect 400 "max_tokens of the wrong type" '{"max_tokens": "9", "messages": [{"role": "user", "content": "hi"}]}'
expect 400 "an image that is not an image" "$(img "$(echo 'just some text, not a PNG' | base64 -w0)")"
expect 400 "a truncated image" "$(img "${png:0:400}")"
expect 400 "malformed base64" "$(img 'iVBOR*w0KGgo')"
python3 "$(dirname "$0")/../support/make-images.py" "$DIR"
expect 400 "an image declaring 40000x40000 pixels" "$(img "$(base64 -w0 "$DIR/huge.png")")"
expect 200 "a 20000x1 image" "$(img "$(base64 -w0 "$DIR/wide.png")")"
expect 400 "a remote image URL" '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}'
expect 400 "a prompt over the context" "{\"messages\": [{\"role\": \"user\", \"content\": \"$(head -c 40000 /dev/zero | tr '\0' 'a')\"}]}"
expect 400 "an unknown method" '{"kv_compression": {"method": "nosuch"}, "messages": [{"role": "user", "content": "hi"}]}'
expect 400 "a budget below the window" '{"kv_compression": {"budget": 2, "window": 8}, "messages": [{"role": "user", "content": "hi"}]}'
expect 400 "an unknown method option" '{"kv_compression": {"bugdet": 8}, "messages": [{"role": "user", "content": "hi"}]}'
expect 400 "head scores from a client" '{"kv_compression": {"head_scores": "/etc/passwd"}, "messages": [{"role": "user", "content": "hi"}]}'
expect 200 "the next request is served" "$(img "$png")"
# Chunked prefill (kv_compression.chunk) of two pages: the answer of `ecokv run --chunk` on the same prompt, and
# a chunk not larger than the window refused.
two() { echo "{\"max_tokens\":16,\"kv_compression\":{\"chunk\":$1,\"budget\":64,\"window\":8},\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,$png\"}},{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,$png\"}},{\"type\":\"text\",\"text\":\"What is the TOTAL?\"}]}]}"; }
expect 400 "a chunk not larger than the window" "$(two 8)"
served=$(curl -s -H 'Content-Type: application/json' --data-binary "$(two 64)" "$URL/v1/chat/completions" |
         python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])')
ran=$("$ECOKV" run --image "$ROOT/models/tiny-vlm-sample.png" --image "$ROOT/models/tiny-vlm-sample.png" \
      --question "What is the TOTAL?" -m snapkv+ecokv -b 64 --window 8 --chunk 64 -n 16 --json 2>/dev/null |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["text"])')
[[ "$served" == "$ran" ]] || { echo "not ok - chunked answer: served '$served', ecokv run '$ran'"; exit 1; }
echo "ok - a chunked conversation answers as ecokv run --chunk ('$served')"
status=$(curl -s -o /dev/null -w '%{http_code}' "$URL/nosuch"); [[ $status == 404 ]] && echo "ok - unknown endpoint (404)"
status=$(curl -s -o "$DIR/out" -w '%{http_code}' --data-binary "$(img "$png")" "$URL/v1/chat/completions")  # no JSON type
[[ $status == 413 ]] && grep -q 'application/json' "$DIR/out" || { echo "not ok - form-encoded body: $status"; exit 1; }
echo "ok - a large body sent form-encoded (413, says to send JSON)"
curl -s "$URL/health" | grep -q '"ok"' && echo "ok - health"

metrics=$(curl -s "$URL/metrics")
for m in ecokv_requests_total ecokv_cache_hits_total ecokv_kv_cache_bytes ecokv_kv_cache_full_bytes ecokv_decode_tokens_per_second; do
    grep -q "^$m " <<< "$metrics" || { echo "not ok - metric $m missing"; exit 1; }
done
hits=$(awk '/^ecokv_cache_hits_total /{print $2}' <<< "$metrics")
[[ ${hits%.*} -ge 1 ]] || { echo "not ok - no cache hit counted"; exit 1; }
echo "ok - metrics (cache hits $hits)"

# A server with one slot and no queue refuses what it cannot take with 503 and an OpenAI error body.
start busy --slots 1 --queue 0 --max-tokens 64
body=$(img "$png")
for i in $(seq 10); do
    curl -s -o "$DIR/busy.$i" -w '%{http_code}\n' -H 'Content-Type: application/json' --data-binary "$body" \
        "$URL/v1/chat/completions" > "$DIR/busy.$i.status" &
done
wait $(jobs -p | grep -vxF -f <(printf '%s\n' "${PIDS[@]}")) 2>/dev/null || true  # the requests, not the servers
n503=$(cat "$DIR"/busy.*.status | grep -c 503 || true)
n200=$(cat "$DIR"/busy.*.status | grep -c 200 || true)
[[ $n503 -ge 1 && $n200 -ge 1 ]] || { echo "not ok - busy server: $n200 served, $n503 refused"; exit 1; }
grep -l 503 "$DIR"/busy.*.status | head -1 | sed 's/\.status$//' | xargs grep -q 'server_busy'
echo "ok - a full server refuses with 503 ($n200 served, $n503 refused)"

# A 20-turn conversation about the page (docs/conversations.md): compressed again after each answer with
# recompress_slack 16, the longest head holds at most budget + slack + that turn's cells after every turn (asserted by
# conversation.mjs) and every turn is a hit; appended instead, the same conversation grows with every turn.
URL=http://127.0.0.1:$(cat "$DIR/main.port")
node "$ROOT/tests/server/conversation.mjs" "$URL" "$ROOT/models/tiny-vlm-sample.png" 20 64 16 > "$DIR/bounded.jsonl"
node "$ROOT/tests/server/conversation.mjs" "$URL" "$ROOT/models/tiny-vlm-sample.png" 20 64 -1 > "$DIR/appended.jsonl"
python3 - "$DIR/bounded.jsonl" "$DIR/appended.jsonl" <<'PY'
import json, sys
bounded, appended = ([json.loads(line) for line in open(f)] for f in sys.argv[1:])
peak = max(t["entries_held"] for t in bounded)
assert sum(t["recompressions"] for t in bounded) >= 10, bounded
assert peak <= 64 + 16 + max(t["turn_cells"] for t in bounded[1:]), peak
assert appended[-1]["entries_held"] > 4 * 64, appended[-1]
assert all(a["entries_held"] < b["entries_held"] for a, b in zip(appended, appended[1:])), "appended turns grow"
print(f"ok - 20 turns: at most {peak} entries a head with re-compression, {appended[-1]['entries_held']} appended")
PY
png64=$(base64 -w0 "$ROOT/models/tiny-vlm-sample.png")
long="{\"max_tokens\":16,\"kv_compression\":{\"decode_compress\":6},\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,$png64\"}},{\"type\":\"text\",\"text\":\"Read all text.\"}]}]}"
curl -s -H 'Content-Type: application/json' --data-binary "$long" "$URL/v1/chat/completions" | python3 -c '
import json, sys
u = json.load(sys.stdin)["usage"]
# 64 kept after the prompt; the question and 15 answer tokens decoded, compressed again to the budget whenever 6
# cells were decoded since: never more than 64 + 6 entries a head.
assert u["kv_recompressions"] >= 2 and u["kv_entries_held"] <= 64 + 6, u
print("ok - decode_compress 6: %d re-compressions, %d entries a head after 16 tokens" % (u["kv_recompressions"], u["kv_entries_held"]))'
expect 200 "recompress_slack with h2o (streamed)" '{"kv_compression": {"method": "h2o", "recompress_slack": 4}, "messages": [{"role": "user", "content": "hi"}]}'
expect 400 "decode_compress within the window" '{"kv_compression": {"decode_compress": 2}, "messages": [{"role": "user", "content": "hi"}]}'

# A quantized cache (-ctk/-ctv q8_0) under eviction: a row of 32 elements is 34 bytes against F16's 64, so with the
# same layout (uniform budget 64 per head, the same room) the bytes kept are 34/64 of the F16 server's, and so is the
# allocation (kept rows and room) on the CPU: a lone request answers solo, in a context of its own. On a device each
# head's rows start at the buffer's alignment (llama_kv_ragged_row_align: q8_0's 34-byte rows are padded, F16's are
# not), so there q8_0 allocates at least 34/64 of F16's and less than F16. The kept conversation is resumed by a
# follow-up turn.
ask() {  # ask URL MESSAGES: POST them with budget 64, print "kept<TAB>allocated<TAB>answer"
    curl -s -H 'Content-Type: application/json' --data-binary "{\"max_tokens\":8,\"kv_compression\":{\"budget\":64,\"window\":8},\"messages\":$2}" \
        "$1/v1/chat/completions" |
        python3 -c 'import json, sys; r = json.load(sys.stdin); u = r["usage"]; print(u["kv_bytes_kept"], u["kv_bytes_allocated"], r["choices"][0]["message"]["content"], sep="\t")'
}
page="[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,$png\"}},{\"type\":\"text\",\"text\":\"What is the TOTAL?\"}]}"
f16=$(ask "http://127.0.0.1:$(cat "$DIR/main.port")" "$page]")
start q8 --max-tokens 16 -ctk q8_0 -ctv q8_0 -fa on
q8=$(ask "$URL" "$page]")
IFS=$'\t' read -r q8_kept q8_alloc q8_answer <<< "$q8"
IFS=$'\t' read -r f16_kept f16_alloc _ <<< "$f16"
(( q8_kept * 64 == f16_kept * 34 )) || { echo "not ok - q8_0 kept $q8_kept bytes, F16 $f16_kept"; exit 1; }
if [[ -z ${SERVE_ARGS:-} ]]; then
    (( q8_alloc * 64 == f16_alloc * 34 )) || { echo "not ok - q8_0 allocation $q8_alloc, F16 $f16_alloc"; exit 1; }
else
    (( q8_alloc * 64 >= f16_alloc * 34 && q8_alloc < f16_alloc )) ||
        { echo "not ok - q8_0 allocation $q8_alloc, F16 $f16_alloc on a device"; exit 1; }
fi
answer=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$q8_answer")
ask "$URL" "$page,{\"role\":\"assistant\",\"content\":$answer},{\"role\":\"user\",\"content\":\"And the DATE?\"}]" > /dev/null
hits=$(curl -s "$URL/metrics" | awk '/^ecokv_cache_hits_total /{print $2}')
[[ ${hits%.*} -ge 1 ]] || { echo "not ok - the q8_0 conversation was not resumed"; exit 1; }
echo "ok - a q8_0 cache under eviction keeps 34/64 of F16's ($q8_kept against $f16_kept bytes; allocated $q8_alloc, $f16_alloc), resumed"
"$ECOKV" serve -ctv q8_0 -fa off --port 0 2> "$DIR/bad.log" && { echo "not ok - q8_0 V without flash attention served"; exit 1; }
grep -q "a quantized V cache needs flash attention" "$DIR/bad.log" || { cat "$DIR/bad.log"; exit 1; }
echo "ok - a quantized V without flash attention is refused at start"

# 16 identical requests at once, 8 answering together: every one is answered (200) with the same greedy answer. The
# first to prefill keeps the prompt's conversation; the others find it while it answers, and must not resume with
# nothing left to decode.
content() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' "$1"; }
# all_at_once NAME N URL BODY_OF: N chat requests at once (request i's body from `BODY_OF i`, curl's --data-binary), each
# answer in $DIR/NAME.i; every one must be 200.
all_at_once() {
    local name=$1 n=$2 url=$3 body_of=$4 i
    for i in $(seq "$n"); do
        curl -s -o "$DIR/$name.$i" -w '%{http_code}\n' -H 'Content-Type: application/json' --data-binary "$($body_of "$i")" \
            "$url/v1/chat/completions" > "$DIR/$name.$i.status" &
    done
    wait $(jobs -p | grep -vxF -f <(printf '%s\n' "${PIDS[@]}")) 2>/dev/null || true
    [[ $(cat "$DIR/$name".*.status | grep -c '^200$') == "$n" ]] ||
        { cat "$DIR/$name".*.status "$DIR/$name.1"; echo "not ok - $name: not every request answered 200"; exit 1; }
}
start race --slots 8 --queue 16 --max-tokens 48
same() { echo '{"temperature":0.0,"messages":[{"role":"user","content":"Tell me a story about a red fox."}]}'; }
all_at_once race 16 "$URL" same
answers=$(for i in $(seq 16); do content "$DIR/race.$i"; done | sort -u | wc -l)
[[ $answers == 1 ]] || { echo "not ok - 16 identical greedy requests gave $answers answers"; exit 1; }
echo "ok - 16 identical concurrent requests: all 200, one answer"

# The decode loop (issue 50): 12 requests at once, half of them about the sample image (compressed: kept rows), half
# text (full caches: cells only), on a server holding 8 sequences in a small pool (-c 1024 rows a head, 256 of them for
# kept entries): every one 200, with the greedy answer of a server decoding each request alone (--no-batch); its steps
# decoded several sequences' tokens at once; /props shows the pool.
start loop --slots 8 --queue 16 --max-tokens 24 -c 1024 --kv-kept-rows 256
loop_url=$URL
start alone --slots 2 --max-tokens 24 --no-batch
alone_url=$URL
/usr/bin/python3 - "$ROOT/models/tiny-vlm-sample.png" "$DIR" <<'PY'
import base64, json, sys
image = "data:image/png;base64," + base64.b64encode(open(sys.argv[1], "rb").read()).decode()
for i in range(1, 13):
    text = {"type": "text", "text": f"What is written on line {i}?" if i % 2 else f"Tell me story number {i}."}
    content = [{"type": "image_url", "image_url": {"url": image}}, text] if i % 2 else [text]
    json.dump({"temperature": 0.0, "ignore_eos": True, "messages": [{"role": "user", "content": content}]},
              open(f"{sys.argv[2]}/loop-body.{i}", "w"))
PY
loop_body() { echo "@$DIR/loop-body.$1"; }
all_at_once loop 12 "$loop_url" loop_body
# On a device (SERVE_ARGS="-ngl 99", scripts/test-gpu.sh) a step of several tokens runs other kernels than one token
# alone (matrix-matrix against matrix-vector shaders), so a greedy tie can fall the other way: there the logits' match
# is tests/llama/test-batch.cpp's (offloaded, within tolerance), and the answers are compared on the CPU only.
[[ -n ${SERVE_ARGS:-} ]] && device_loop=1 || device_loop=0
for i in $(seq $(( device_loop ? 0 : 12 ))); do
    curl -s -o "$DIR/alone.$i" -H 'Content-Type: application/json' --data-binary "@$DIR/loop-body.$i" "$alone_url/v1/chat/completions"
    [[ $(content "$DIR/loop.$i") == "$(content "$DIR/alone.$i")" ]] ||
        { echo "not ok - request $i: '$(content "$DIR/loop.$i")' in the loop, '$(content "$DIR/alone.$i")' alone"; exit 1; }
done
metric() { curl -s "$loop_url/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
steps=$(metric ecokv_decode_steps_total) tokens=$(metric ecokv_decode_step_tokens_total)
python3 -c 'import sys; s, t = float(sys.argv[1]), float(sys.argv[2]); assert 0 < s < t, (s, t)' "$steps" "$tokens" ||
    { echo "not ok - no step decoded several sequences ($steps steps, $tokens tokens)"; exit 1; }
curl -s "$loop_url/props" | python3 -c 'import json, sys; m = json.load(sys.stdin)["kv_memory"]; assert (m["cells"], m["kept_rows"], m["sequences"], m["cells_used"]) == (768, 256, 0, 0), m' ||
    { echo "not ok - /props kv_memory"; exit 1; }
# every one of them decoded in the loop (on lavapipe too: flash attention is on, V not transposed); a turn compressing
# while it decodes cannot, and is counted
alone_before=$(metric ecokv_answers_decoded_alone_total)
curl -s -o /dev/null -H 'Content-Type: application/json' --data-binary "$long" "$loop_url/v1/chat/completions"
alone_after=$(metric ecokv_answers_decoded_alone_total)
[[ $alone_before == 0 && $(( alone_after - alone_before )) == 1 ]] ||
    { echo "not ok - answers decoded alone: $alone_before, then $alone_after"; exit 1; }
echo "ok - all 12 decoded in the loop, a decode_compress turn alone"
echo "ok - the decode loop: 12 requests at once$( ((device_loop)) && echo ' (answers not compared on a device)' || echo ' answer as each alone'), $tokens tokens in $steps steps"

# A request alone decodes solo (on its own thread, as --no-batch does); another coming while it streams makes it enter
# the loop mid-answer. Both answer as each alone; the metrics count one solo answer start to end, then one that joined.
solo_before=$(metric ecokv_answers_solo_total) joined_before=$(metric ecokv_answers_solo_joined_total)
curl -s -o /dev/null -H 'Content-Type: application/json' --data-binary "@$DIR/loop-body.2" "$loop_url/v1/chat/completions"
[[ $(( $(metric ecokv_answers_solo_total) - solo_before )) == 1 ]] || { echo "not ok - a lone request did not decode solo"; exit 1; }
long_story='{"temperature":0.0,"ignore_eos":true,"max_tokens":300,"stream":true,"messages":[{"role":"user","content":"Tell me a long story."}]}'
curl -sN -H 'Content-Type: application/json' -d "$long_story" "$loop_url/v1/chat/completions" > "$DIR/solo.sse" &
solo_pid=$!
for _ in $(seq 400); do grep -q '"content":"[^"]' "$DIR/solo.sse" 2>/dev/null && break; sleep 0.02; done
curl -s -o "$DIR/beside" -H 'Content-Type: application/json' --data-binary "@$DIR/loop-body.1" "$loop_url/v1/chat/completions"
wait "$solo_pid"
[[ $(( $(metric ecokv_answers_solo_joined_total) - joined_before )) == 1 ]] ||
    { echo "not ok - the streaming solo answer did not enter the loop when another request came"; exit 1; }
if (( ! device_loop )); then
    sse_text() { python3 -c 'import json, sys
print("".join(json.loads(l[6:])["choices"][0]["delta"].get("content", "") for l in open(sys.argv[1])
              if l.startswith("data: {") and json.loads(l[6:])["choices"]))' "$1"; }
    curl -sN -o "$DIR/solo-alone.sse" -H 'Content-Type: application/json' -d "$long_story" "$alone_url/v1/chat/completions"
    # The join comes within the first tokens; the next 100 characters (this model: one token each) show the state it
    # carried into the pool is the one decoded solo. Past them, a batched step's logits are within tolerance of alone,
    # not bitwise: a greedy near-tie at character 141 went the other way in 3 of 6 runs (tests/llama/test-batch.cpp
    # holds the logits to the tolerance).
    solo_text=$(sse_text "$DIR/solo.sse") alone_text=$(sse_text "$DIR/solo-alone.sse")
    [[ ${#solo_text} -ge 100 && ${solo_text:0:100} == "${alone_text:0:100}" && $(content "$DIR/beside") == "$(content "$DIR/alone.1")" ]] ||
        { echo "not ok - answers of a solo answer that joined the loop, or of the request beside it, differ from alone"; exit 1; }
fi
echo "ok - a lone request decodes solo; one streaming when another comes joins the loop mid-answer$( ((device_loop)) || echo ', both as alone (its first 100 characters)')"

# Fields a client sends are honoured or refused with a 400 naming them, never ignored.
URL=http://127.0.0.1:$(cat "$DIR/main.port")
hi='"messages": [{"role": "user", "content": "hi"}]'
refused() {  # refused FIELD BODY: a 400 whose param is FIELD
    local status
    status=$(curl -s -o "$DIR/out" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$2" "$URL/v1/chat/completions")
    python3 -c 'import json, sys; e = json.load(open(sys.argv[1]))["error"]; assert e["param"] == sys.argv[2], e' "$DIR/out" "$1" &&
        [[ $status == 400 ]] || { echo "not ok - $1 refused: HTTP $status $(cat "$DIR/out")"; exit 1; }
    echo "ok - $1 refused: $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["error"]["message"])' "$DIR/out")"
}
refused frobnicate "{\"frobnicate\": 1, $hi}"
refused tools "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], $hi}"
refused response_format "{\"response_format\": {\"type\": \"json_object\"}, $hi}"
refused top_p "{\"top_p\": 0.5, $hi}"
refused cache_prompt "{\"cache_prompt\": false, $hi}"
refused stream_options "{\"stream_options\": {\"include_usage\": true}, $hi}"
refused top_logprobs "{\"top_logprobs\": 3, $hi}"
expect 200 "neutral values of unsupported fields" "{\"top_p\": 1, \"frequency_penalty\": 0, \"tools\": [], \"tool_choice\": \"none\", \"cache_prompt\": true, \"response_format\": {\"type\": \"text\"}, \"user\": \"u1\", $hi}"
# logprobs: one entry per token; greedy picks the most likely, so the chosen token is the first of top_logprobs
curl -s -H 'Content-Type: application/json' --data-binary "{\"temperature\": 0.0, \"logprobs\": true, \"top_logprobs\": 3, \"max_tokens\": 6, ${body:1}" \
    "$URL/v1/chat/completions" > "$DIR/lp"
python3 - "$DIR/lp" <<'PY' || { echo "not ok - logprobs: $(cat "$DIR/lp")"; exit 1; }
import json, math, sys
r = json.load(open(sys.argv[1]))
content = r["choices"][0]["logprobs"]["content"]
assert len(content) == r["usage"]["completion_tokens"], (len(content), r["usage"])
for e in content:
    top = e["top_logprobs"]
    assert len(top) == 3 and top[0]["token"] == e["token"] and abs(top[0]["logprob"] - e["logprob"]) < 1e-9, e
    assert all(a["logprob"] >= b["logprob"] for a, b in zip(top, top[1:])) and e["logprob"] <= 0
    assert sum(math.exp(t["logprob"]) for t in top) <= 1 + 1e-9 and bytes(e["bytes"]).decode() == e["token"], e
assert "".join(e["token"] for e in content) == r["choices"][0]["message"]["content"], r
PY
echo "ok - logprobs and top_logprobs"
# ignore_eos (llama-server's): the greedy answer that stops early runs on to max_tokens, the same tokens first
for ignore in false true; do
    curl -s -H 'Content-Type: application/json' --data-binary "{\"ignore_eos\": $ignore, \"max_tokens\": 16, ${body:1}" \
        "$URL/v1/chat/completions" > "$DIR/eos.$ignore"
done
python3 - "$DIR/eos.false" "$DIR/eos.true" <<'PY2' || { echo "not ok - ignore_eos: $(cat "$DIR/eos.false" "$DIR/eos.true")"; exit 1; }
import json, sys
short, long = (json.load(open(f)) for f in sys.argv[1:])
assert short["choices"][0]["finish_reason"] == "stop" and short["usage"]["completion_tokens"] < 16, short
assert long["choices"][0]["finish_reason"] == "length" and long["usage"]["completion_tokens"] == 16, long
assert long["choices"][0]["message"]["content"].startswith(short["choices"][0]["message"]["content"]), (short, long)
PY2
refused ignore_eos "{\"ignore_eos\": 1, $hi}"
echo "ok - ignore_eos"
# stream_options.include_usage: usage in one last chunk with no choices, and only when asked
for usage in true false; do
    curl -s -N -H 'Content-Type: application/json' --data-binary "{\"stream\": true, \"stream_options\": {\"include_usage\": $usage}, ${body:1}" \
        "$URL/v1/chat/completions" > "$DIR/sse.$usage"
done
python3 - "$DIR/sse.true" "$DIR/sse.false" <<'PY' || { echo "not ok - include_usage"; exit 1; }
import json, sys
def chunks(path):
    return [json.loads(l[6:]) for l in open(path) if l.startswith("data: {")]
with_usage, without = chunks(sys.argv[1]), chunks(sys.argv[2])
assert with_usage[-1]["choices"] == [] and with_usage[-1]["usage"]["completion_tokens"] >= 1, with_usage[-1]
assert not any("usage" in c for c in with_usage[:-1]) and not any("usage" in c for c in without)
PY
echo "ok - stream_options.include_usage"
# llama-server's endpoints: /tokenize and /detokenize round trip, /props, /slots
curl -s -H 'Content-Type: application/json' --data-binary '{"content": "What is the TOTAL?", "with_pieces": true}' "$URL/tokenize" > "$DIR/tok"
ids=$(python3 -c 'import json, sys; print(json.dumps([t["id"] for t in json.load(open(sys.argv[1]))["tokens"]]))' "$DIR/tok")
back=$(curl -s -H 'Content-Type: application/json' --data-binary "{\"tokens\": $ids}" "$URL/detokenize" | python3 -c 'import json, sys; print(json.load(sys.stdin)["content"])')
pieces=$(python3 -c 'import json, sys; print("".join(t["piece"] for t in json.load(open(sys.argv[1]))["tokens"]))' "$DIR/tok")
[[ "$back" == "What is the TOTAL?" && "$pieces" == "$back" ]] || { echo "not ok - tokenize round trip: '$back' '$pieces'"; exit 1; }
status=$(curl -s -o "$DIR/out" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary '{"tokens": [1, -5]}' "$URL/detokenize")
[[ $status == 400 ]] || { echo "not ok - a bad token id: $status"; exit 1; }
python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); assert p["total_slots"] == 2 and p["modalities"]["vision"], p' <(curl -s "$URL/props")
python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); assert [x["id"] for x in s] == [0, 1], s' <(curl -s "$URL/slots")
echo "ok - /tokenize, /detokenize ($ids), /props, /slots"

# --api-key: OpenAI's 401 without the key or with a wrong one; /health open
echo "s3cret-key" > "$DIR/key"
start keyed --api-key-file "$DIR/key"
for auth in "" "Authorization: Bearer wrong" "Authorization: Bearer s3cret-key"; do
    curl -s -o "$DIR/out" -w '%{http_code}\n' ${auth:+-H "$auth"} "$URL/v1/models"
done > "$DIR/auth"
[[ $(tr '\n' ' ' < "$DIR/auth") == "401 401 200 " ]] || { echo "not ok - api key: $(cat "$DIR/auth")"; exit 1; }
curl -s "$URL/v1/models" | grep -q '"code":"invalid_api_key"' || { echo "not ok - 401 body"; exit 1; }
[[ $(curl -s -o /dev/null -w '%{http_code}' "$URL/health") == 200 ]] || { echo "not ok - /health behind the key"; exit 1; }
echo "ok - --api-key (401 without or with a wrong key, /health open)"

# /v1/completions: a raw text prompt (no chat template), OpenAI's text_completion, streamed the same
URL=http://127.0.0.1:$(cat "$DIR/main.port")
plain=$(curl -s -H 'Content-Type: application/json' --data-binary '{"prompt": "TOTAL", "max_tokens": 6, "temperature": 0.0}' "$URL/v1/completions")
text=$(python3 -c 'import json, sys; r = json.loads(sys.argv[1]); assert r["object"] == "text_completion" and r["usage"]["completion_tokens"] >= 1, r; print(r["choices"][0]["text"])' "$plain")
streamed=$(curl -s -N -H 'Content-Type: application/json' --data-binary '{"prompt": "TOTAL", "max_tokens": 6, "temperature": 0.0, "stream": true}' "$URL/v1/completions" |
           python3 -c 'import json, sys; print("".join(json.loads(l[6:])["choices"][0]["text"] for l in sys.stdin if l.startswith("data: {")))')
[[ "$streamed" == "$text" ]] || { echo "not ok - completion '$text', streamed '$streamed'"; exit 1; }
for bad in '{"prompt": 5}|prompt' '{"prompt": "x", "echo": true}|echo' '{"prompt": "x", "logprobs": 2}|logprobs'; do
    status=$(curl -s -o "$DIR/out" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "${bad%|*}" "$URL/v1/completions")
    [[ $status == 400 ]] && grep -q "\"param\":\"${bad#*|}\"" "$DIR/out" || { echo "not ok - ${bad#*|}: $status $(cat "$DIR/out")"; exit 1; }
done
echo "ok - /v1/completions ('$text', streamed alike; a bad prompt, echo and logprobs refused)"

# Connections that cannot starve the server: 200 slow clients, a deadline for each request, a cap on connections.
# SKIP_SLOW_CLIENTS=1 (scripts/test-gpu.sh) leaves it to the CPU job: it tests the HTTP layer, not the device, and its
# timings do not hold beside lavapipe, which takes the cores.
if [[ "${SKIP_SLOW_CLIENTS:-}" == 1 ]]; then
    echo "ok - slow clients: skipped (SKIP_SLOW_CLIENTS)"
    exit 0
fi
start slow --request-timeout 5 --max-tokens 4
slow_port=$(cat "$DIR/slow.port")
start capped --max-connections 20
python3 "$ROOT/tests/server/slow-clients.py" "$slow_port" 5 "$(cat "$DIR/capped.port")" 20
