// ecokv: non-owning strided views over F32/F16/U8 data, or rows an engine encodes itself (quantized KV cache
// blocks), laid out like ggml tensors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace ecokv {

// `encoded`: rows in an engine's own format (llama.cpp's q8_0, q4_0, ... KV blocks), read only through a row_codec.
enum class dtype : uint8_t { f32, f16, u8, encoded };

size_t           dtype_size(dtype type);  // bytes per element; not defined for `encoded` (asserts)
std::string_view dtype_name(dtype type);  // "F32", "F16", "U8" (safetensors spelling), "ENCODED"

// How an engine's encoded rows decode: whole blocks of block_size elements in block_bytes bytes each. The core
// decodes one row at a time into a caller's scratch, so no F32 copy of an encoded tensor is ever made whole.
struct row_codec {
    const char * name        = "";  // the engine's name of the type ("q8_0")
    int64_t      block_size  = 1;
    size_t       block_bytes = 0;
    void (*to_f32)(const void * row, float * out, int64_t n) = nullptr;  // n: a multiple of block_size

    size_t row_bytes(int64_t n) const { return size_t(n / block_size) * block_bytes; }
};

// IEEE half <-> single precision. f32_to_f16 rounds to nearest even, as every engine does.
float    f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// A view of up to 4 dimensions. As in ggml, ne[0] is the fastest-varying dimension and nb[i] is the
// byte stride of dimension i; rows (dimension 0) must be contiguous (nb[0] == dtype_size(type); for `encoded`
// rows, nb[0] is unused and `codec` says how a row of ne[0] elements is stored).
// A capture tensor of safetensors shape [n_kv_heads, n_tokens, head_dim] has
// ne = {head_dim, n_tokens, n_kv_heads, 1}.
struct tensor_view {
    const void *           data = nullptr;
    dtype                  type = dtype::f32;
    std::array<int64_t, 4> ne   = { 0, 1, 1, 1 };
    std::array<size_t, 4>  nb   = { 0, 0, 0, 0 };
    const row_codec *      codec = nullptr;  // `encoded` only; outlives the view (engines keep static tables)

    // A densely packed view; `shape` is listed outermost first, as safetensors and numpy do.
    static tensor_view packed(const void * data, dtype type, std::initializer_list<int64_t> shape);

    bool    empty() const { return data == nullptr; }
    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    size_t  row_bytes() const;  // bytes of one row of ne[0] elements

    // Start of row (i1, i2, i3): ne[0] contiguous elements of `type`.
    const void * row(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
        return static_cast<const char *>(data) + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
    }

    // Converts row (i1, i2) to ne[0] floats at `out`.
    void row_f32(int64_t i1, int64_t i2, float * out) const;

    // Row (i1, i2) as floats without a copy when the data is aligned F32; otherwise converted into
    // `scratch` (ne[0] floats), which is returned.
    const float * row_f32_view(int64_t i1, int64_t i2, float * scratch) const {
        const void * p = row(i1, i2);
        if (type == dtype::f32 && reinterpret_cast<uintptr_t>(p) % alignof(float) == 0) {
            return static_cast<const float *>(p);
        }
        row_f32(i1, i2, scratch);
        return scratch;
    }
};

}  // namespace ecokv
