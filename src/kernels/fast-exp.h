// A vectorisable exp for softmax: Cody-Waite range reduction and a degree-6 polynomial, max relative
// error ~2e-7 on the range softmax uses (x <= 0). glibc's expf does not vectorise without -ffast-math.
#pragma once

#include <cstdint>
#include <cstring>

namespace ecokv::kernels {

inline float fast_exp(float x) {
    // Written so that NaN (from an overflowing dot product of finite but huge inputs) lands on -87, not in the int
    // conversion below, which would be undefined.
    x = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f;
    // Round to nearest even by the 1.5 * 2^23 shifter: unlike roundevenf it vectorises everywhere.
    const float n  = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float       r  = x - n * 0.693145751953125f;  // ln2 split into a high part exact in float ...
    r              = r - n * 1.42860682030941723212e-6f;  // ... and the low remainder
    float p        = 1.0f / 720;
    p              = p * r + 1.0f / 120;
    p              = p * r + 1.0f / 24;
    p              = p * r + 1.0f / 6;
    p              = p * r + 0.5f;
    p              = p * r + 1.0f;
    p              = p * r + 1.0f;
    const int32_t e = (int32_t(n) + 127) << 23;
    float         scale;
    std::memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

}  // namespace ecokv::kernels
