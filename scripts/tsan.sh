#!/usr/bin/env bash
# The ThreadSanitizer job (issue 34): ecokv built by clang with -fsanitize=thread in build-tsan/, then the server's
# tests (tests/server/test-serve.sh: the openai client's concurrent requests, 16 identical concurrent requests
# resuming one kept conversation, the conversation cache, a full queue; tests/server/test-cluster.sh: replicas sharing
# conversations through Redis) against that server. The slow-clients part
# is the CPU job's (SKIP_SLOW_CLIENTS): its deadlines are timings, and a TSan build runs several times slower (one of
# 200 connections outlived the wait once here, on a loaded machine).
# llama.cpp is not built again: build-tsan links the ordinary build's shared libraries (build/, scripts/test.sh),
# uninstrumented, so TSan checks ecokv's own threads (HTTP connections, slots, the cache, metrics), not ggml's.
# OpenMP's runtime (LLVM's libomp, which also serves ggml's GOMP calls here) synchronises where TSan cannot see it:
# its own accesses are ignored (ignore_noninstrumented_modules), and OMP_NUM_THREADS=1 runs the core's kernels
# inline, so that no false race is reported in them; ggml's threads stay (their code is not instrumented).
# Called by .ci/run after the sanitizer job.
#   scripts/tsan.sh [--build-only]
set -euo pipefail
cd "$(dirname "$0")/.."
B=build-tsan
[[ -f build/bin/libllama.so ]] || bash scripts/test.sh -N >/dev/null  # the ordinary build, for its llama.cpp
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DECOKV_SANITIZE_THREAD=ON \
    -DECOKV_BUILD_TESTS=OFF -DECOKV_BUILD_BENCH=OFF -DECOKV_INSTALL=OFF \
    -DECOKV_LLAMA_PREBUILT_DIR="$PWD/build/bin" >/dev/null
cmake --build $B -j"$(nproc)" --target ecokv-cli
[[ ${1:-} == --build-only ]] && exit 0

# A race or a lock-order inversion in the server ends it (exit 66), and the test that needed it fails.
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 ignore_noninstrumented_modules=1"
export OMP_NUM_THREADS=1
SKIP_SLOW_CLIENTS=1 bash tests/server/test-serve.sh $B/bin/ecokv
# the shared store's writer thread and lookups, Redis going away and coming back, under the same checks
bash tests/server/test-cluster.sh $B/bin/ecokv
echo "tsan.sh: the server's tests passed under ThreadSanitizer"
