// Runtime SIMD dispatch for the hot kernels (private header).
//
// A portable build (ECOKV_NATIVE=OFF, baseline x86-64 = SSE2) still runs the O(T x D) loops with AVX2+FMA
// or AVX-512 where the CPU has them: ECOKV_SIMD_DISPATCH on a function compiles it three times (GCC function
// multiversioning, target_clones) for x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA) and the baseline, and the
// dynamic loader picks one per process (an ifunc resolved from cpuid). Helpers a clone inlines (dot_step,
// fast_exp, sum_squares, ...) are compiled with the clone's ISA; keep them inline, not in another file.
//
// Off (an empty macro) where it cannot or need not work: not x86-64, not GCC >= 12 on glibc (ifunc), or the
// build already targets AVX2 (-march=native or any -m flag defining __AVX2__), or -DECOKV_NO_SIMD_DISPATCH.
// The clones compute the same formulas; as between a native and a portable build, only the fp32 rounding of
// vectorised sums (lane count, FMA contraction) differs, well inside the golden tests' tolerances.
#pragma once

#include <cstdint>  // defines __GLIBC__ on glibc

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__GLIBC__) && \
    !defined(__AVX2__) && !defined(ECOKV_NO_SIMD_DISPATCH)
#    define ECOKV_SIMD_DISPATCH      __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#    define ECOKV_HAVE_SIMD_DISPATCH 1
#else
#    define ECOKV_SIMD_DISPATCH
#    define ECOKV_HAVE_SIMD_DISPATCH 0
#endif

// Forces inlining into a dispatched caller, so that the helper is compiled for the caller's clone.
#if defined(__GNUC__)
#    define ECOKV_SIMD_INLINE inline __attribute__((always_inline))
#else
#    define ECOKV_SIMD_INLINE inline
#endif
