#!/usr/bin/env bash
# Faults, as a hostile user or machine would make them (issue 15), asserted:
#   1. every command that writes (synth-capture, compress, run --dump-capture, eval, report, serve --port-file), into
#      a read-only directory and onto a full disk (a file-size limit of 1 KiB with SIGXFSZ ignored, so writes fail with EFBIG;
#      not 0: the OpenMP runtime of a clang build sizes a 1 KiB file in /dev/shm at start):
#      exit 1, a message naming the path, and nothing half-written left behind;
#   2. ecokv eval killed with SIGKILL at random moments (seeded), resumed each time: the same table as one run; ecokv
#      report killed while it merges two shards: its outputs are absent or whole, and a rerun gives the same table;
#   3. bad images (truncated, empty, declaring 40000x40000 pixels, text named .png) through run and eval: a clear
#      error naming the file (run), a failed item with its reason while the others are answered (eval); a 20000x1
#      image is answered.
# As root a read-only directory does not stop writes, so those commands run as nobody (setpriv).
#   test-faults.sh ECOKV MODELS_DIR
set -uo pipefail
E=$(realpath "$1")
M=$(realpath "$2")
DIR=$(mktemp -d)
chmod 755 "$DIR"
trap 'chmod -R u+w "$DIR"; rm -rf "$DIR"' EXIT
fails=0
ok() { echo "ok - $1"; }
bad() { echo "FAIL - $1"; fails=$((fails + 1)); }
as_user() { if [[ $(id -u) == 0 ]]; then setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"; else "$@"; fi; }
# nobody may not reach the build tree (a checkout under a private directory, as mktemp -d makes): as root, the binary,
# its libraries and the models it reads are copied into $DIR (755) and found there.
if [[ $(id -u) == 0 ]]; then
    mkdir -p "$DIR/bin" "$DIR/models"
    cp "$E" "$DIR/bin/"
    for lib in $(ldd "$E" | awk '$3 ~ /^\// && $1 ~ /^lib(llama|ggml|mtmd)/ { print $3 }'); do
        cp "$lib" "$DIR/bin/$(basename "$lib")"
    done
    cp "$M/stories260K.gguf" "$M/tiny-vlm.gguf" "$M/tiny-vlm-mmproj.gguf" "$M/tiny-vlm-sample.png" "$DIR/models/"
    E=$DIR/bin/$(basename "$E")
    M=$DIR/models
    export LD_LIBRARY_PATH="$DIR/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# A command must exit 1 naming $path, and leave no file in $where (eval: its directory, its lock, a whole config.json
# and whole records only, which a resume continues).
expect_refused() {
    local name=$1 path=$2 where=$3
    shift 3
    local err rc
    err=$("$@" 2>&1 >/dev/null)
    rc=$?
    local left
    left=$(find "$where" -mindepth 1 -newer "$DIR/stamp" -type f ! -name lock ! -name results.jsonl ! -name config.json \
        2>/dev/null | head -3)
    for r in $(find "$where" -name results.jsonl -newer "$DIR/stamp"); do
        python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$r" 2>/dev/null || left="$left $r"
    done
    for r in $(find "$where" -name config.json -newer "$DIR/stamp"); do
        python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$r" 2>/dev/null || left="$left $r"
    done
    if [[ $rc == 1 && $err == *"$path"* && -z $left ]]; then ok "$name"; else
        bad "$name: exit $rc, '$err', left: $left"
    fi
}

STORY='Once upon a time there was a little girl named Lily. She liked to play with her ball in the park every day.'
"$E" synth-capture -o "$DIR/cap.safetensors" --layers 2 --heads 4 --kv-heads 2 --head-dim 16 --tokens 300 \
    --queries 8 --seed 11 >/dev/null || bad "synth-capture for the fixtures"
mkdir -p "$DIR/data"
cp "$M/tiny-vlm-sample.png" "$DIR/data/page.png"
for i in 0 1 2; do
    echo "{\"id\": \"q$i\", \"image\": [\"page.png\"], \"question\": \"What is the TOTAL?\", \"answers\": [\"64.02\"], \"type\": \"t\"}"
done > "$DIR/data/items.jsonl"
eval_args=(eval --model "$M/tiny-vlm.gguf" --mmproj "$M/tiny-vlm-mmproj.gguf" --dataset generated --data "$DIR/data"
           --methods full,snapkv+ecokv,pyramidkv+ecokv --budgets 32,64 --window 4 -n 6 -t 1 --mode agnostic)
"$E" "${eval_args[@]}" --out "$DIR/one" >/dev/null 2>&1 && "$E" report "$DIR/one" >/dev/null 2>&1 ||
    bad "uninterrupted eval"
table() { python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["generated"], sort_keys=True))' "$1"; }
reference=$(table "$DIR/one/report.json")

# ---- 1. read-only directory, full disk -------------------------------------------------------------------------
writers() {  # name, output path, command writing it
    local out=$1/out
    W_NAMES=(synth-capture compress run-dump-capture eval report serve-port-file)
    W_PATHS=("$out.safetensors" "$out.json" "$out.capture" "$out" "$out-report" "$out.port")
    W_CMDS=(
        "$E synth-capture -o $out.safetensors --layers 2 --heads 4 --kv-heads 2 --head-dim 16 --tokens 300 --queries 8"
        "$E compress -i $DIR/cap.safetensors -o $out.json -m snapkv -b 64 --window 8 -q"
        "$E run --model $M/stories260K.gguf -p '$STORY' -b 8 -n 2 -t 1 --dump-capture $out.capture"
        "$E ${eval_args[*]} --out $out"
        "$E report $DIR/one --out $out-report"
        "timeout 20 $E serve --model $M/stories260K.gguf --port 0 --port-file $out.port"
    )
}
mkdir -p "$DIR/ro"
chmod 555 "$DIR/ro"
writers "$DIR/ro"
touch "$DIR/stamp"
for i in "${!W_NAMES[@]}"; do
    expect_refused "${W_NAMES[$i]} into a read-only directory" "${W_PATHS[$i]}" "$DIR/ro" as_user bash -c "${W_CMDS[$i]}"
done
mkdir -p "$DIR/full"
writers "$DIR/full"
for i in "${!W_NAMES[@]}"; do
    [[ ${W_NAMES[$i]} == serve-port-file ]] && continue  # a port number is a few bytes: no disk is that full
    rm -rf "$DIR/full"/*
    touch "$DIR/stamp"
    expect_refused "${W_NAMES[$i]} onto a full disk" "${W_PATHS[$i]}" "$DIR/full" \
        bash -c "trap '' XFSZ; ulimit -f 1; ${W_CMDS[$i]}"
done

# ---- 2. SIGKILL at random moments ------------------------------------------------------------------------------
# Seeds below 250,000 (250,000-999,999 are reserved for external checks).
RANDOM=4242
for k in 1 2 3 4; do
    "$E" "${eval_args[@]}" --out "$DIR/killed" >/dev/null 2>&1 &
    pid=$!
    sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
done
"$E" "${eval_args[@]}" --out "$DIR/killed" >/dev/null 2>&1 && "$E" report "$DIR/killed" >/dev/null 2>&1
[[ $(table "$DIR/killed/report.json") == "$reference" ]] && ok "eval killed 4 times and resumed: the same table" ||
    bad "eval killed and resumed: another table"

"$E" "${eval_args[@]}" --shard 0/2 --out "$DIR/s0" >/dev/null 2>&1 &&
    "$E" "${eval_args[@]}" --shard 1/2 --out "$DIR/s1" >/dev/null 2>&1 || bad "shards"
whole=1
for k in 1 2 3 4 5 6; do
    "$E" report "$DIR/s0" "$DIR/s1" >/dev/null 2>&1 &
    pid=$!
    sleep "0.0$((RANDOM % 10))"
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    for f in "$DIR/s0"/report.*; do
        [[ -e $f ]] || continue
        [[ $f == *.json ]] && ! python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$f" 2>/dev/null && whole=0
        [[ $f == *.tmp* ]] && whole=0
    done
done
"$E" report "$DIR/s0" "$DIR/s1" >/dev/null 2>&1
[[ $whole == 1 ]] && ok "report killed during a shard merge leaves whole files" || bad "report left a broken file"
[[ $(table "$DIR/s0/report.json") == "$reference" ]] && ok "the merged shards give the same table" ||
    bad "merged shards: another table"

# ---- 3. bad images -----------------------------------------------------------------------------------------------
mkdir -p "$DIR/img"
head -c 400 "$M/tiny-vlm-sample.png" > "$DIR/img/truncated.png"
: > "$DIR/img/empty.png"
echo 'just some text, not a PNG' > "$DIR/img/text.png"
python3 "$(dirname "$0")/../support/make-images.py" "$DIR/img"
run_img=(run --model "$M/tiny-vlm.gguf" --mmproj "$M/tiny-vlm-mmproj.gguf" -n 4 -t 1 -p "What is the TOTAL?")
for name in truncated empty text huge; do
    err=$("$E" "${run_img[@]}" --image "$DIR/img/$name.png" 2>&1 >/dev/null)
    rc=$?
    [[ $rc == 1 && $err == *"$DIR/img/$name.png"* ]] && ok "run: $name image refused ($err)" ||
        bad "run: $name image: exit $rc, $err"
done
"$E" "${run_img[@]}" --image "$DIR/img/wide.png" >/dev/null 2>&1 && ok "run: a 20000x1 image is answered" ||
    bad "run: 20000x1 image"

mkdir -p "$DIR/imgdata"
cp "$DIR/img"/*.png "$M/tiny-vlm-sample.png" "$DIR/imgdata/"
for name in truncated empty text huge wide tiny-vlm-sample; do
    echo "{\"id\": \"$name\", \"image\": [\"$name.png\"], \"question\": \"What is the TOTAL?\", \"answers\": [\"64.02\"], \"type\": \"t\"}"
done > "$DIR/imgdata/items.jsonl"
"$E" eval --model "$M/tiny-vlm.gguf" --mmproj "$M/tiny-vlm-mmproj.gguf" --dataset generated --data "$DIR/imgdata" \
    --methods snapkv+ecokv --budgets 32 -n 6 -t 1 --out "$DIR/imgeval" >/dev/null 2>&1
rc=$?
python3 - "$DIR/imgeval/results.jsonl" <<'PY'
import json, sys
records = {r['id']: r for r in map(json.loads, open(sys.argv[1]))}
for name in ['truncated', 'empty', 'text', 'huge']:
    r = records[name]
    assert r['error'] and r['prediction'] is None, (name, r)
    assert f'{name}.png' in json.dumps(r), (name, r)
for name in ['wide', 'tiny-vlm-sample']:
    assert 'error' not in records[name] and records[name]['prediction'] is not None, (name, records[name])
PY
checked=$?
[[ $rc == 0 && $checked == 0 ]] && ok "eval: the four bad images are failed items naming the file, the others answered" ||
    bad "eval with bad images (exit $rc)"

echo "$fails failed"
[[ $fails == 0 ]]
