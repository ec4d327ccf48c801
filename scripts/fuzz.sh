#!/usr/bin/env bash
# Fuzzes the libFuzzer targets of fuzz/ (clang, AddressSanitizer, UBSan; the build-san/ tree of scripts/sanitize.sh,
# linked with llama.cpp for the server's request reading). Each target starts from its committed corpus
# (fuzz/corpus/<target>), the inputs once fixed (fuzz/regressions/<target>) and seeds the project's own tools write;
# new inputs go to build-san/corpus/<target>. Stops at SECONDS per target or RUNS executions, whichever comes first.
# Crashes are left as build-san/crashes/<target>/crash-*; copy them to fuzz/regressions/<target>/ once fixed.
#   scripts/fuzz.sh [--no-build] [SECONDS (60)] [RUNS (-1: no limit)] [TARGET ...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=1
[[ ${1:-} == --no-build ]] && { BUILD=0; shift; }
SECONDS_EACH=${1:-60}
RUNS=${2:--1}
shift 2 || shift $# || true
ALL=(fuzz-capture fuzz-head-scores fuzz-method fuzz-metric-items fuzz-datasets fuzz-chat-request fuzz-entry)
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=("${ALL[@]}")
B=build-san
if [[ $BUILD == 1 ]]; then
    bash scripts/sanitize.sh --build-only
fi

# Seeds from the project's tools and test data (the committed corpora hold what fuzzing added to them).
C=$B/corpus
S=$B/seeds
if [[ ! -d $S ]]; then
    mkdir -p $S.tmp/{capture,head-scores,method,metric-items,datasets,chat-request,entry}
    for shape in "2 2 1 16 24" "1 4 2 8 40"; do
        read -r l h kv d t <<< "$shape"
        $B/bin/ecokv synth-capture -o "$S.tmp/capture/synth-$l-$t.safetensors" --layers "$l" --heads "$h" \
            --kv-heads "$kv" --head-dim "$d" --tokens "$t" --queries 8 --seed 7 >/dev/null
    done
    cp tests/data/golden/*.safetensors $S.tmp/capture/
    cp tests/data/golden/head-scores-*.json $S.tmp/head-scores/
    for m in snapkv+ecokv "pyramidkv 64 8 5 20 0.2" "adakv+mixkv 32 4 3 20 0.5" lookm madakv "sparsemm+knorm 16 2"; do
        printf '%s' "$m" > "$S.tmp/method/$(echo "$m" | tr ' +' '__')"
    done
    find tests/data -name '*.jsonl' -size -64k -exec cp {} $S.tmp/metric-items/ \;
    find tests/data -name '*.json*' -size -64k -exec cp {} $S.tmp/datasets/ \;
    mv $S.tmp $S
fi

ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export ASAN_OPTIONS
status=0
for t in "${TARGETS[@]}"; do
    mkdir -p $B/crashes/$t $C/$t fuzz/corpus/$t $S/${t#fuzz-}
    dirs=($C/$t fuzz/corpus/$t $S/${t#fuzz-})
    [[ -d fuzz/regressions/$t ]] && dirs+=(fuzz/regressions/$t)
    echo "== $t: up to $SECONDS_EACH s, $RUNS runs"
    log=$B/crashes/$t.log
    if ! $B/bin/$t -max_total_time="$SECONDS_EACH" -runs="$RUNS" -rss_limit_mb=4096 -max_len=65536 -timeout=20 \
            -artifact_prefix=$B/crashes/$t/ -print_final_stats=1 "${dirs[@]}" >"$log" 2>&1; then
        status=1
    fi
    grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss|ERROR|SUMMARY" "$log" | tail -5
    # libFuzzer also leaves slow-unit-* files (a unit over 10 s, under the 20 s timeout): on a shared machine a stall
    # makes them (a 0.05 s unit took 14 s once), so they are reported, not failed; timeout-* files still fail.
    ls $B/crashes/$t/ 2>/dev/null | grep -q '^slow-unit-' && echo "$t: slow units (not failures) in $B/crashes/$t"
    ls $B/crashes/$t/ 2>/dev/null | grep -v '^slow-unit-' | grep -q . &&
        { echo "$t: crashes in $B/crashes/$t (log $log)"; status=1; }
done
exit $status
