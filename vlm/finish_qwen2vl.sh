#!/usr/bin/env bash
# After training: everything tiny-qwen2vl's card needs that does not take hours, from the run's checkpoint.
#   bash vlm/finish_qwen2vl.sh [RUN] [PREFIX]      (defaults: vlm/runs/qwen2, models/tiny-qwen2vl)
# 1. export (PREFIX.gguf, PREFIX-mmproj.gguf) and check it against llama.cpp's cache;
# 2. SparseMM head scores (PREFIX-head-scores.json), the issue's targets after training (models/targets/);
# 3. the sample page (held-out seed 240014, every question: PREFIX-sample/, the main job's) and `ecokv analyze` of it
#    with plots (PREFIX-analysis/);
# 4. the run's learning curve (PREFIX-curve-RUN.png, RUN the run directory's name).
# Then `bash vlm/evaluate.sh PREFIX` (hours) gives the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:-vlm/runs/qwen2}
prefix=${2:-models/tiny-qwen2vl}
name=$(basename "$prefix")
py=/usr/bin/python3
ckpt=$run/ckpt.pt
[ -f "$ckpt" ] || { echo "finish: $ckpt missing" >&2; exit 1; }

$py vlm/export_qwen2vl.py "$ckpt" --out "$prefix"
$py vlm/check_export.py "$ckpt" "$prefix"
$py vlm/head_scores.py "$ckpt" --out "$prefix-head-scores.json"
mkdir -p models/targets
$py vlm/check_targets.py "$ckpt" --out "models/targets/$name-trained.json"
[ -f "models/targets/$name-init.json" ] || $py vlm/check_targets.py "$ckpt" --init --out "models/targets/$name-init.json"
$py vlm/gen_pages.py --seed 240014 --count 1 --task qa --all-questions --out "$prefix-sample"
build/bin/ecokv analyze --model "$prefix.gguf" --mmproj "$prefix-mmproj.gguf" --image "$prefix-sample/images/qa-240014.png" -p "" \
    -m snapkv+ecokv -b 100 --window 8 --out "$prefix-analysis"
$py vlm/plot_curve.py "$run/log.csv" "$prefix-curve-$(basename "$run").png"
