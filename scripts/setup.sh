#!/usr/bin/env bash
# Installs what ecokv needs on Debian 12 (apt-get), builds it, and runs the main job on the bundled default:
# a realistic synthetic capture compressed with SnapKV + ECOKV at budget 64.
#   scripts/setup.sh [--no-demo]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build git pkg-config libgtest-dev libgmock-dev libbenchmark-dev
          nlohmann-json3-dev libcxxopts-dev python3-numpy)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "== installing: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "== building (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"

[ "${1:-}" = "--no-demo" ] && exit 0

echo "== main job: compress a synthetic 8-layer capture (2048 tokens, image tokens 64..1600) with snapkv+ecokv"
build/bin/ecokv synth-capture --layers 8 --heads 16 --kv-heads 4 --head-dim 64 --tokens 2048 \
    --image-tokens 64:1600 --seed 7 --output build/demo-capture.safetensors
build/bin/ecokv compress --input build/demo-capture.safetensors --method snapkv+ecokv --budget 64 \
    --output build/demo-selection.json
