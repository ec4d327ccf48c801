#!/usr/bin/env bash
# Peak memory and time of a long prompt's prefill, one shot against chunked (issue 12), with bench-prefill, one
# process per run so that each peak is the run's own:
#   2k and 8k tokens at Qwen2-VL-2B's text geometry (28 layers, 1536 wide, 2 KV heads of 128; Q8_0, vocab 32768);
#   32k tokens (32704) at a smaller geometry, "small": 8 layers, 1024 wide, 8 query / 2 KV heads of 128, ff 2816,
#   vocab 8192 (a 2B prefill of 32k tokens takes hours on 2 cores);
# each as full (the uncompressed prefill), one-shot (prefill, then compression in place) and chunked (--chunk 512),
# with snapkv+ecokv at budget 256. Then the 32k one-shot and chunked runs again under a memory limit halfway between
# their peaks (scripts/with-memory-limit.sh): the one-shot run is killed, the chunked one completes.
#
#   bash bench/bench-prefill.sh [OUT]      (default bench/results/bench-prefill; finished runs are kept: rerun to resume)
#   SIZES="2k" bash bench/bench-prefill.sh (only some sizes; MEMORY_LIMIT=0 skips the limited runs)
# Tables: OUT/bench-prefill.md and .json (bench/bench-prefill-table.py).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/bench-prefill}
bench=build/bin/bench-prefill
py=/usr/bin/python3
[ -x "$bench" ] || { echo "bench-prefill.sh: build bench-prefill first (cmake --build build --target bench-prefill)" >&2; exit 1; }
mkdir -p "$out"
method=(--method snapkv+ecokv --budget 256 --chunk 512)
small=(--layers 8 --embd 1024 --heads 8 --kv-heads 2 --ff 2816 --vocab 8192)

one() {  # name tokens mode [options]
    local name=$1 tokens=$2 mode=$3
    shift 3
    local file="$out/$name-$mode.json"
    [ -f "$file" ] && return 0
    echo "== $name $mode" >&2
    "$bench" --tokens "$tokens" --mode "$mode" "${method[@]}" "$@" --json-file "$file" >/dev/null
}

for size in ${SIZES:-2k 8k 32k}; do
    case $size in
        2k) for m in full one-shot chunked; do one 2k 2048 $m; done ;;
        8k) for m in full one-shot chunked; do one 8k 8192 $m; done ;;
        32k) for m in full one-shot chunked; do one 32k 32704 $m "${small[@]}"; done ;;
        *) echo "bench-prefill.sh: unknown size $size (2k, 8k, 32k)" >&2; exit 1 ;;
    esac
done

if [ "${MEMORY_LIMIT:-1}" != 0 ] && [ -f "$out/32k-one-shot.json" ] && [ -f "$out/32k-chunked.json" ]; then
    limit=$($py -c 'import json, sys
peak = [json.load(open(f))["peak_rss_kib"] for f in sys.argv[1:]]
print(int(sum(peak) / 2 / 1024))' "$out/32k-one-shot.json" "$out/32k-chunked.json")
    : >"$out/memory-limit.tsv"
    for m in one-shot chunked; do
        echo "== 32k $m under a $limit MiB limit" >&2
        set +e
        scripts/with-memory-limit.sh "$limit" "$bench" --tokens 32704 --mode $m "${method[@]}" "${small[@]}" \
            --json-file "$out/32k-$m-limited.json" >/dev/null 2>"$out/32k-$m-limited.log"
        rc=$?
        set -e
        printf '%s\t%s\t%s\t%s\n' "$m" "$limit" "$rc" "$(tail -n 1 "$out/32k-$m-limited.log")" >>"$out/memory-limit.tsv"
        tail -n 1 "$out/32k-$m-limited.log" >&2
    done
fi
$py bench/bench-prefill-table.py "$out"
