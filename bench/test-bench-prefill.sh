#!/usr/bin/env bash
# Smoke test of bench-prefill on a tiny random model (seconds): every mode runs and decodes; the chunked run's peak
# stays within the first chunk's context (2 x 256 cells, a multiple of llama.cpp's 256-cell padding) while one shot
# holds the whole 2000-token prompt; a bad option exits 1 with a message.
#   bench/test-bench-prefill.sh path/to/bench-prefill
set -euo pipefail
B=$1
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
shape=(--layers 2 --embd 64 --heads 2 --kv-heads 1 --ff 128 --vocab 512 --threads 1 --tokens 2000 --n-decode 4)
for m in full one-shot chunked; do
    "$B" "${shape[@]}" --mode $m --chunk 256 -b 128 --json-file "$DIR/$m.json" >/dev/null 2>&1 ||
        { echo "not ok - $m run failed"; exit 1; }
done
python3 - "$DIR" <<'PY'
import json, sys
d = sys.argv[1]
r = {m: json.load(open(f"{d}/{m}.json")) for m in ("full", "one-shot", "chunked")}
assert r["chunked"]["peak_kv_cells"] <= 512, r["chunked"]["peak_kv_cells"]
assert r["one-shot"]["peak_kv_cells"] >= 2000 and r["full"]["peak_kv_cells"] >= 2000, r["one-shot"]["peak_kv_cells"]
assert r["chunked"]["kv_bytes_allocated"] == r["one-shot"]["kv_bytes_allocated"]  # B + room in every head, both
assert r["chunked"]["kv_bytes_allocated"] < r["full"]["kv_bytes_allocated"] / 4
for m, x in r.items():
    assert x["decode_tokens_per_s"] > 0 and x["prompt_tokens_per_s"] > 0, m
print("ok - bench-prefill: chunked peak %d cells, one shot %d" % (r["chunked"]["peak_kv_cells"], r["one-shot"]["peak_kv_cells"]))
PY
if "$B" --mode nope 2>"$DIR/err"; then echo "not ok - --mode nope accepted"; exit 1; fi
grep -q "bench-prefill: error: --mode nope" "$DIR/err" || { echo "not ok - error message: $(cat "$DIR/err")"; exit 1; }
echo "ok - a bad option is refused"
