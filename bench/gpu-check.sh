#!/usr/bin/env bash
# The GPU check (bench/gpu.md): on a machine with an NVIDIA GPU (CUDA) or any Vulkan GPU, builds ecokv with that
# backend (CUDA for this GPU's architecture only, to keep the build short), runs the exact-logit tests of the ragged
# cache on the device (test-adapter, test-session and the eight families' test-families with every layer offloaded;
# their failures are reported with the op and tolerance, the benches still run), then bench-decode and bench-prefill at Qwen2-VL-2B's shape with every
# layer on the device:
#   - decode tok/s of compressed caches against an uncompressed context of the same cells (target >= 0.97), for a
#     uniform budget (one attention per layer) and AdaKV (one per KV head);
#   - compression time against the prefill (target < 2%), with the bytes copied to the host;
#   - device memory the compressed context takes (ggml_backend_dev_memory), against its kept entries.
# Writes bench/results/gpu-<backend>-<date>/ (JSON and logs). Meant to finish in under 8 minutes on one GPU; nothing
# in the test suite depends on it.
#   bench/gpu-check.sh [--backend cuda|vulkan]   (cuda when nvcc is found, else vulkan)
set -euo pipefail
cd "$(dirname "$0")/.."
backend=vulkan
command -v nvcc >/dev/null 2>&1 && backend=cuda
[ "${1:-}" = --backend ] && backend=${2:?--backend needs cuda or vulkan}
build_dir=build-$backend
out=bench/results/gpu-$backend-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
t0=$(date +%s)

cmake_args=""
[ "$backend" = cuda ] && cmake_args="-DCMAKE_CUDA_ARCHITECTURES=native"
ECOKV_CMAKE_ARGS="$cmake_args" ECOKV_BUILD_TARGETS="ecokv-cli bench-decode bench-prefill test-adapter test-session test-families" \
    bash scripts/setup.sh --no-demo --backend "$backend" 2>&1 | tail -3
"$build_dir/bin/ecokv" run --list-devices | tee "$out/devices.txt"
grep -q '^  [A-Za-z]*0: ' "$out/devices.txt" || { echo "gpu-check.sh: no $backend device"; exit 1; }
threads=$(nproc)
echo "build: $(( $(date +%s) - t0 )) s"

echo "== exact-logit tests on the device (every layer offloaded; the CPU tests' tolerances)"
# Vulkan: ggml-vulkan's F32 shaders, as in scripts/test-gpu.sh; CUDA runs as it is (its F16 paths are what is checked).
if GGML_VK_DISABLE_F16=1 ECOKV_TEST_NGL=99 ctest --test-dir "$build_dir" --output-on-failure -j4 -R 'adapter\.|session\.|^families/' \
        > "$out/exact-tests.log" 2>&1; then
    echo "exact-logit tests: all passed" | tee "$out/exact-tests.txt"
else
    grep -E "tests passed|Failed|FAILED" "$out/exact-tests.log" | tee "$out/exact-tests.txt"
fi

echo "== bench-decode, 2B shape, every layer on the device (8192 tokens; uniform and AdaKV budgets)"
"$build_dir/bin/bench-decode" -ngl all -fa on --threads "$threads" --tokens 8192 --n-decode 64 --repeats 3 \
    --budgets 256,1024 --methods snapkv+ecokv,adakv+ecokv --json-file "$out/bench-decode.json" \
    2> "$out/bench-decode.log" | tee "$out/bench-decode.txt"

echo "== bench-prefill, 2B shape: compression against the prefill"
"$build_dir/bin/bench-prefill" -ngl all -fa on --threads "$threads" --json-file "$out/bench-prefill.json" \
    2> "$out/bench-prefill.log" | tee "$out/bench-prefill.txt" || echo "bench-prefill failed: see $out/bench-prefill.log"

python3 - "$out" <<'PY'
import json, sys
d = json.load(open(f"{sys.argv[1]}/bench-decode.json"))
print(f"{'method':22} {'B':>5} {'decode ratio':>12} {'compress %pf':>12} {'to host MiB':>11} {'device ctx MiB':>14} {'kept+room MiB':>13}")
for r in d["rows"][1:]:
    ctx = r["device_bytes_of_compressed_context"]
    print(f"{r['method']:22} {r['budget']:5} {r['decode_speed_ratio']:12.3f} {100 * r['compress_over_prefill']:12.2f} "
          f"{r['bytes_to_host'] / 2**20:11.2f} {ctx / 2**20 if ctx >= 0 else float('nan'):14.2f} "
          f"{(r['kv_bytes_kept'] + r['kv_bytes_room']) / 2**20:13.2f}")
PY
echo "gpu-check.sh: done in $(( $(date +%s) - t0 )) s; results in $out"
