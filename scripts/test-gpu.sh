#!/usr/bin/env bash
# The GPU job (docs/gpu.md): builds ecokv with a GPU backend into build-<backend>/ (nothing shared with build/) and runs
# on its device what depends on where the cache lives: the exact-logit tests of the ragged cache against the reference
# forward (test-adapter, test-session: uniform, PyramidKV, AdaKV, MadaKV, merges, chunked prefill, snapshots; llama,
# qwen2, qwen2vl, qwen3vl and gemma3's sliding-window layers; flash attention on and off) with every layer offloaded and with one layer left on the CPU, the bytes a
# compression copies to the host, counted by hand; the eight VLM families' exact tests; the bundled tiny VLM answering
# the README's question with the same greedy tokens on the device as on the CPU; and the server tests with every layer
# offloaded.
#   scripts/test-gpu.sh [--backend vulkan|cuda]
# Vulkan runs where no GPU is on Mesa's lavapipe, a Vulkan device on the CPU that ggml-vulkan lists only when
# GGML_VK_VISIBLE_DEVICES names it (0 here unless set): slow, but the device path, buffers and kernels are real.
set -euo pipefail
cd "$(dirname "$0")/.."
backend=vulkan
[ "${1:-}" = --backend ] && backend=${2:?--backend needs cpu, vulkan or cuda}
build_dir=build-$backend
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}

ECOKV_BUILD_TARGETS="ecokv-cli test-adapter test-session test-batch test-families test-run test-tiny-vlm" \
    bash scripts/setup.sh --no-demo --backend "$backend"
ecokv=$build_dir/bin/ecokv
"$ecokv" run --list-devices | tee "$build_dir/devices.txt"
grep -q '^  [A-Za-z]*0: ' "$build_dir/devices.txt" || { echo "test-gpu.sh: no $backend device"; exit 1; }

# At the CPU tests' tolerances with F32 shaders: lavapipe reports fp16, and ggml-vulkan's F16 MUL_MAT and
# FLASH_ATTN_EXT shaders then round Q/K/V and attention to F16 (1.6e-4 to 4.2e-4 relative between two equal caches of
# different lengths, docs/gpu.md); GGML_VK_DISABLE_F16 is ggml-vulkan's switch for that.
exact='adapter\.|session\.|batch\.'
for ngl in 99 2; do  # every layer; the last layer and the output (layer 0 stays on the CPU)
    echo "== exact-logit tests, ECOKV_TEST_NGL=$ngl"
    GGML_VK_DISABLE_F16=1 ECOKV_TEST_NGL=$ngl ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" -R "$exact"
done
echo "== the eight families (docs/families.md), every layer and the projector on the device (F32 shaders)"
GGML_VK_DISABLE_F16=1 ECOKV_TEST_NGL=99 ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" -R '^families/'
echo "== the CLI on the device (every layer offloaded: -ngl auto; F32 shaders, as above)"
GGML_VK_DISABLE_F16=1 ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" -R '^run\.|tiny_vlm\.'

echo "== the README's question: the same greedy tokens on the device as on the CPU"
question=(run --image models/tiny-vlm-sample.png --question "What is the TOTAL?" --method snapkv+ecokv --budget 64
          --json -n 16)
"$ecokv" "${question[@]}" -ngl 0 --no-mmproj-offload > "$build_dir/answer-cpu.json"
"$ecokv" "${question[@]}" -ngl all > "$build_dir/answer-gpu.json"
python3 - "$build_dir" <<'PY'
import json, sys
cpu, gpu = (json.load(open(f"{sys.argv[1]}/answer-{w}.json")) for w in ("cpu", "gpu"))
a, b = cpu["answers"][0]["text"], gpu["answers"][0]["text"]
print(f"CPU: {a!r}  device: {b!r}  bytes to host: {cpu['bytes_to_host']} / {gpu['bytes_to_host']}")
sys.exit(0 if a == b and gpu["bytes_to_host"] > 0 else 1)
PY

echo "== ecokv serve -ngl 99 (the slow-clients part is the CPU job's: tests/server/test-serve.sh says why)"
SERVE_ARGS="-ngl 99" SKIP_SLOW_CLIENTS=1 bash tests/server/test-serve.sh "$ecokv"
echo "test-gpu.sh: all passed on $backend"
