#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang, AddressSanitizer and UBSan (build-fuzz/, no llama.cpp), makes
# their seed corpora with the project's own tools and test data, and fuzzes each for SECONDS (default 60).
# Crashes are left as build-fuzz/crashes/<target>/crash-*; copy them to fuzz/regressions/<target>/ once fixed.
#   scripts/fuzz.sh [SECONDS] [TARGET ...]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(fuzz-capture fuzz-head-scores fuzz-method fuzz-metric-items fuzz-datasets)
B=build-fuzz
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
    -DECOKV_FUZZ=ON -DECOKV_SANITIZE_ADDRESS=ON -DECOKV_SANITIZE_UNDEFINED=ON -DECOKV_LLAMA=OFF \
    -DECOKV_BUILD_TESTS=OFF -DECOKV_BUILD_BENCH=OFF -DECOKV_INSTALL=OFF >/dev/null
cmake --build $B --target "${TARGETS[@]}" ecokv-cli

# Seed corpora: files the tools write, plus the test data of the readers.
C=$B/corpus
mkdir -p $C/fuzz-capture $C/fuzz-head-scores $C/fuzz-method $C/fuzz-metric-items $C/fuzz-datasets
for shape in "2 2 1 16 24" "1 4 2 8 40"; do
    read -r l h kv d t <<< "$shape"
    $B/bin/ecokv synth-capture -o "$C/fuzz-capture/synth-$l-$t.safetensors" --layers "$l" --heads "$h" \
        --kv-heads "$kv" --head-dim "$d" --tokens "$t" --queries 8 --seed 7 >/dev/null
done
cp tests/data/golden/*.safetensors $C/fuzz-capture/
cp tests/data/golden/head-scores-*.json $C/fuzz-head-scores/
printf '{"0-0": [0.5, 0.1], "0-1": [0.2, 0.3], "1-2": [0.9, 0.0]}' > $C/fuzz-head-scores/scores.json
for m in snapkv+ecokv "pyramidkv 64 8 5 20 0.2" "adakv+mixkv 32 4 3 20 0.5" lookm madakv "sparsemm+knorm 16 2"; do
    printf '%s' "$m" > "$C/fuzz-method/$(echo "$m" | tr ' +' '__')"
done
find tests/data -name '*.jsonl' -size -64k -exec cp {} $C/fuzz-metric-items/ \;
find tests/data -name '*.json*' -size -64k -exec cp {} $C/fuzz-datasets/ \;

status=0
for t in "${TARGETS[@]}"; do
    mkdir -p $B/crashes/$t
    echo "== $t: $SECONDS_EACH s"
    regressions=()
    [[ -d fuzz/regressions/$t ]] && regressions=(fuzz/regressions/$t)
    if ! $B/bin/$t -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 -max_len=65536 \
            -artifact_prefix=$B/crashes/$t/ -print_final_stats=1 $C/$t "${regressions[@]}" 2>&1 | \
            grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss|ERROR|SUMMARY|cov:" | tail -4; then
        status=1
    fi
    ls $B/crashes/$t/ 2>/dev/null | grep -q . && { echo "$t: crashes in $B/crashes/$t"; status=1; }
done
exit $status
