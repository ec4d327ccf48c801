#!/usr/bin/env bash
# Installs what ecokv needs on Debian 12 (apt-get), fetches the pinned llama.cpp 0.5.0 (npm package
# node-llama-cpp@3.22.1, see scripts/fetch-llama.sh), builds everything, and runs the main job (`ecokv run` with no
# options) on the bundled default: tiny-qwen2vl (models/tiny-qwen2vl.md) prefills a receipt, its KV cache is
# compressed to 100 entries per head before any question is known, then the page's questions are answered by the
# full cache, SnapKV, SnapKV + ECOKV and the full cache of the page resized to as many entries.
#   scripts/setup.sh [--no-demo] [--training] [--backend cpu|vulkan|cuda]
# --backend builds llama.cpp's ggml with that GPU backend besides the CPU (docs/gpu.md), into build/ for cpu (the
# default) and build-<backend>/ otherwise: vulkan installs Debian's Vulkan loader, headers and glslc (and Mesa's
# lavapipe, a Vulkan device on the CPU that the tests use); cuda needs NVIDIA's CUDA toolkit (nvcc), which Debian's
# main archive does not have: install it first.
# --training also installs what vlm/train*.py need (PyTorch with OpenBLAS); CI does not train. Pillow draws
# tiny-qwen2vl's pages (vlm/gen_pages.py), matplotlib the plots of ecokv analyze.
set -euo pipefail
cd "$(dirname "$0")/.."

backend=cpu
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
    case "${args[i]}" in
        --backend) backend="${args[i + 1]:-}" ;;
        --backend=*) backend="${args[i]#--backend=}" ;;
    esac
done
case "$backend" in
    cpu | vulkan | cuda) ;;
    *) echo "setup.sh: --backend must be cpu, vulkan or cuda, not '$backend'" >&2; exit 2 ;;
esac
if [ "$backend" = cuda ] && ! command -v nvcc >/dev/null 2>&1; then
    echo "setup.sh: --backend cuda needs NVIDIA's CUDA toolkit (nvcc on PATH); it is not in Debian's main archive" >&2
    exit 2
fi
build_dir=build
[ "$backend" = cpu ] || build_dir="build-$backend"

packages=(build-essential cmake ninja-build git pkg-config libgtest-dev libgmock-dev libbenchmark-dev
          nlohmann-json3-dev libcxxopts-dev libcpp-httplib-dev curl python3-numpy python3-pil python3-matplotlib
          chromium pybind11-dev python3-dev libxxhash-dev libssl-dev libhiredis-dev redis-server haproxy)
# libssl-dev: SHA-256 names images in the caches' keys; chromium: the chat page's test in a real browser; pybind11: import ecokv; hiredis, redis-server, haproxy: the
# replicas' shared store and the cluster of deploy/ (docs/serve.md, "Several servers")
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)  # npm fetches the llama.cpp source
# Without libopenblas0-pthread Debian's torch runs on the reference BLAS, about 9x slower.
[[ " $* " == *" --training "* ]] && packages+=(python3-torch libopenblas0-pthread)
[ "$backend" = vulkan ] && packages+=(libvulkan-dev glslc spirv-headers mesa-vulkan-drivers)

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

bash scripts/fetch-llama.sh
echo "== test clients for ecokv serve (npm: openai, autocannon; tests/server/package-lock.json)"
(cd tests/server && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
echo "== building ($build_dir/, backend $backend)"
generator=()
[ -f "$build_dir/CMakeCache.txt" ] || generator=(-G Ninja)
# ECOKV_CMAKE_ARGS: more CMake options (bench/gpu-check.sh: -DCMAKE_CUDA_ARCHITECTURES=native).
read -r -a cmake_args <<< "${ECOKV_CMAKE_ARGS:-}"
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DECOKV_BACKEND="$backend" \
    ${cmake_args[@]+"${cmake_args[@]}"} >/dev/null
# ECOKV_BUILD_TARGETS (space-separated) builds only those (scripts/test-gpu.sh); the default builds everything.
read -r -a targets <<< "${ECOKV_BUILD_TARGETS:-}"
cmake --build "$build_dir" -j"$(nproc)" ${targets[@]+--target "${targets[@]}"}
# The Python module into the interpreter's site-packages, so that `python3 -c "import ecokv"` works (python/).
if [ "$backend" = cpu ] && ((${#targets[@]} == 0)); then
    cmake --install "$build_dir" --component python >/dev/null
fi

[[ " $* " == *" --no-demo "* ]] && exit 0

echo "== main job: tiny-qwen2vl reads a receipt; its KV cache is compressed to 100 entries per head before the"
echo "   questions are asked"
"$build_dir"/bin/ecokv run
