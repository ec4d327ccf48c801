#include "ecokv/tensor.h"

#include "impl.h"

#include <bit>
#include <cstring>

#include "kernels/simd.h"

#if defined(__F16C__) || ECOKV_HAVE_SIMD_DISPATCH
#    include <immintrin.h>
#endif

namespace ecokv {

size_t dtype_size(dtype type) {
    switch (type) {
        case dtype::f32: return 4;
        case dtype::f16: return 2;
        case dtype::u8:  return 1;
        case dtype::encoded: break;  // a row's size is its codec's
    }
    ECOKV_ASSERT(false);
}

std::string_view dtype_name(dtype type) {
    switch (type) {
        case dtype::f32: return "F32";
        case dtype::f16: return "F16";
        case dtype::u8:  return "U8";
        case dtype::encoded: return "ENCODED";
    }
    ECOKV_ASSERT(false);
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    const uint32_t exp  = (h >> 10) & 0x1f;
    const uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) {  // inf / nan
        return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    }
    if (exp == 0) {  // zero / subnormal: mant * 2^-24, exact in float
        const float v = float(mant) * 0x1p-24f;
        return sign ? -v : v;
    }
    return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
    const uint32_t x    = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (x >> 16) & 0x8000;
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) {  // inf / nan (keep nan a nan)
        return uint16_t(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    }
    if (absx >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
        return uint16_t(sign | 0x7c00);
    }
    if (absx < 0x38800000u) {  // below the smallest normal half: round to a subnormal
        // value * 2^24 rounded to nearest even gives the subnormal mantissa (may carry into 0x400).
        const float    v = std::bit_cast<float>(absx) * 0x1p24f;
        const uint32_t m = uint32_t(__builtin_nearbyintf(v));
        return uint16_t(sign | m);
    }
    // Normal: drop 13 mantissa bits with round to nearest even.
    const uint32_t rebased = absx - (112u << 23);
    const uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
    return uint16_t(sign | (rounded >> 13));
}

size_t tensor_view::row_bytes() const {
    return type == dtype::encoded ? codec->row_bytes(ne[0]) : size_t(ne[0]) * dtype_size(type);
}

tensor_view tensor_view::packed(const void * data, dtype type, std::initializer_list<int64_t> shape) {
    ECOKV_ASSERT(shape.size() >= 1 && shape.size() <= 4);
    tensor_view v;
    v.data = data;
    v.type = type;
    int i  = 0;
    for (auto it = std::rbegin(shape); it != std::rend(shape); ++it) {
        v.ne[i++] = *it;
    }
    v.nb[0] = dtype_size(type);
    for (int d = 1; d < 4; ++d) {
        v.nb[d] = v.nb[d - 1] * size_t(v.ne[d - 1]);
    }
    return v;
}

#if !defined(__F16C__) && ECOKV_HAVE_SIMD_DISPATCH
namespace {
// Runtime dispatch (src/kernels/simd.h) for portable builds: the same hardware conversion where the CPU has F16C.
__attribute__((target("avx,f16c"))) int64_t f16_to_f32_f16c(const uint16_t * h, float * out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i))));
    }
    return i;
}
const bool k_has_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}  // namespace
#endif

void tensor_view::row_f32(int64_t i1, int64_t i2, float * out) const {
    const void * src = row(i1, i2);
    switch (type) {
        case dtype::f32:
            std::memcpy(out, src, size_t(ne[0]) * sizeof(float));
            return;
        case dtype::f16: {
            const auto * h = static_cast<const uint16_t *>(src);
            int64_t      i = 0;
#if defined(__F16C__)
            for (; i + 8 <= ne[0]; i += 8) {  // hardware conversion, bit-identical to f16_to_f32
                _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i))));
            }
#elif ECOKV_HAVE_SIMD_DISPATCH
            if (k_has_f16c) {
                i = f16_to_f32_f16c(h, out, ne[0]);
            }
#endif
            for (; i < ne[0]; ++i) {  // F16 rows may start at odd offsets (safetensors): no aligned uint16_t loads
                uint16_t v;
                std::memcpy(&v, reinterpret_cast<const uint8_t *>(h) + i * sizeof(uint16_t), sizeof v);
                out[i] = f16_to_f32(v);
            }
            return;
        }
        case dtype::u8: {
            const auto * u = static_cast<const uint8_t *>(src);
            for (int64_t i = 0; i < ne[0]; ++i) {
                out[i] = float(u[i]);
            }
            return;
        }
        case dtype::encoded:
            codec->to_f32(src, out, ne[0]);
            return;
    }
}

}  // namespace ecokv
