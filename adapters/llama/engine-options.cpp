// THE list of engine options (ecokv/llama-options.h), with llama.cpp's names, meanings and defaults where ecokv
// keeps them. One deviation: llama.cpp's -b is --batch-size, ecokv's -b has been --budget from the start, so the
// batch size is --batch-size only.
#include "ecokv/llama-options.h"

#include "devices.h"

#include <algorithm>
#include <limits>

namespace ecokv::llama {

namespace {

constexpr double k_int_max = std::numeric_limits<int32_t>::max();

template <auto M> option_value get_int(const engine_option &, const session_options & o) { return int64_t(o.*M); }
template <auto M> void set_int(const engine_option &, session_options & o, const option_value & v) {
    o.*M = int32_t(std::get<int64_t>(v));
}

// llama.cpp's flash-attention values, in the order of the row's choices.
constexpr llama_flash_attn_type k_flash[] = { LLAMA_FLASH_ATTN_TYPE_ENABLED, LLAMA_FLASH_ATTN_TYPE_DISABLED,
                                              LLAMA_FLASH_ATTN_TYPE_AUTO };
// llama.cpp's KV cache types, in its order (common/arg.cpp) and the order of the rows' choices.
constexpr ggml_type k_cache_types[] = { GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
                                        GGML_TYPE_Q4_1, GGML_TYPE_IQ4_NL, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1 };

// Their names as llama.cpp parses them: ggml's ("q8_0").
std::vector<std::string_view> cache_type_names() {
    std::vector<std::string_view> names;
    for (const ggml_type t : k_cache_types) {
        names.emplace_back(ggml_type_name(t));
    }
    return names;
}

template <class E, size_t N> size_t index_of(const E (&values)[N], E v) {
    return size_t(std::find(values, values + N, v) - values);
}
template <class E, size_t N> E chosen(const E (&values)[N], const engine_option & o, const option_value & v) {
    return values[std::find(o.choices.begin(), o.choices.end(), std::get<std::string>(v)) - o.choices.begin()];
}

// -ngl: a count, or llama.cpp's words for all layers and for a fit to free memory.
option_value get_layers(const engine_option &, const session_options & o) {
    return o.n_gpu_layers == session_options::k_auto_layers  ? option_value{ std::string("auto") }
           : o.n_gpu_layers == session_options::k_all_layers ? option_value{ std::string("all") }
                                                              : option_value{ int64_t(o.n_gpu_layers) };
}
void set_layers(const engine_option &, session_options & o, const option_value & v) {
    const std::string * word = std::get_if<std::string>(&v);
    o.n_gpu_layers           = !word          ? int32_t(std::get<int64_t>(v))
                               : *word == "all" ? session_options::k_all_layers
                                                : session_options::k_auto_layers;
}

// --device: checked against the devices of this build (an unknown name lists them).
option_value get_devices(const engine_option &, const session_options & o) { return o.devices; }
void set_devices(const engine_option & r, session_options & o, const option_value & v) {
    o.devices = std::get<std::string>(v);
    try {
        offload_devices(o);
    } catch (const error & e) {  // an option error, as the other rows': the caller names the flag's source
        throw option_error(std::string(r.key), e.what());
    }
}

option_value get_no_mmproj_offload(const engine_option &, const session_options & o) {
    return int64_t(o.mmproj_offload ? 0 : 1);
}
void set_no_mmproj_offload(const engine_option &, session_options & o, const option_value & v) {
    o.mmproj_offload = std::get<int64_t>(v) == 0;
}

option_value get_flash(const engine_option & r, const session_options & o) {
    return std::string(r.choices[index_of(k_flash, o.flash_attn)]);
}
void set_flash(const engine_option & r, session_options & o, const option_value & v) { o.flash_attn = chosen(k_flash, r, v); }
template <auto M> option_value get_type(const engine_option & r, const session_options & o) {
    return std::string(r.choices[index_of(k_cache_types, o.*M)]);
}
template <auto M> void set_type(const engine_option & r, session_options & o, const option_value & v) {
    o.*M = chosen(k_cache_types, r, v);
}

using option_kind::choice, option_kind::integer, option_kind::text;
using option_record::never, option_record::unless_default;

const std::vector<engine_option> & table() {
    // Columns: {key, short name, kind, lo, hi, lo_open, choices, unset, help}, alias, record, get, set.
    // clang-format off
    static const std::vector<engine_option> rows = {
        { { "ctx_size", 'c', integer, 0, k_int_max, false, {}, "",
            "most KV cells a sequence may hold, prompt and new tokens (0: the model's training context)" },
          "", unless_default, get_int<&session_options::n_ctx>, set_int<&session_options::n_ctx> },
        { { "threads", 't', integer, 0, 512, false, {}, "",
            "CPU threads (0: the physical cores of the CPUs this process may use)" },
          "", never, get_int<&session_options::n_threads>, set_int<&session_options::n_threads> },
        { { "threads_batch", 0, integer, 0, 512, false, {}, "", "CPU threads of prompt processing (0: --threads)" },
          "-tb", never, get_int<&session_options::n_threads_batch>, set_int<&session_options::n_threads_batch> },
        { { "batch_size", 0, integer, 1, k_int_max, false, {}, "", "logical batch: cells decoded per llama_decode call" },
          "", unless_default, get_int<&session_options::n_batch>, set_int<&session_options::n_batch> },
        { { "ubatch_size", 0, integer, 0, k_int_max, false, {}, "", "physical batch (0: llama.cpp's, 512)" },
          "-ub", unless_default, get_int<&session_options::n_ubatch>, set_int<&session_options::n_ubatch> },
        { { "flash_attn", 0, choice, 0, 0, false, { "on", "off", "auto" }, "", "flash attention" },
          "-fa", unless_default, get_flash, set_flash },
        { { "cache_type_k", 0, choice, 0, 0, false, cache_type_names(), "", "KV cache type of K" },
          "-ctk", unless_default, get_type<&session_options::type_k>, set_type<&session_options::type_k> },
        { { "cache_type_v", 0, choice, 0, 0, false, cache_type_names(), "",
            "KV cache type of V (a quantized type needs flash attention)" },
          "-ctv", unless_default, get_type<&session_options::type_v>, set_type<&session_options::type_v> },
        { { "image_max_tokens", 0, integer, 0, 1 << 20, false, {}, "",
            "resize each image to at most N tokens (dynamic-resolution projectors such as Qwen2-VL; 0: the "
            "projector's own limit)" },
          "", unless_default, get_int<&session_options::image_max_tokens>, set_int<&session_options::image_max_tokens> },
        { { "n_gpu_layers", 0, integer, 0, k_int_max, false, { "auto", "all" }, "",
            "layers whose weights and KV cache go to the GPU: a number, all, or auto (all; llama.cpp's fit to free "
            "memory is not done)" },
          "-ngl", unless_default, get_layers, set_layers },
        { { "device", 0, text, 0, 0, false, {}, "every GPU device",
            "comma-separated devices to offload to (none: no offload; --list-devices shows them)" },
          "-dev", unless_default, get_devices, set_devices },
        { { "no_mmproj_offload", 0, option_kind::flag, 0, 0, false, {}, "", "run the image projector on the CPU" },
          "", unless_default, get_no_mmproj_offload, set_no_mmproj_offload },
    };
    // clang-format on
    return rows;
}

}  // namespace

std::span<const engine_option> engine_options() { return table(); }

std::span<const ggml_type> cache_types() { return k_cache_types; }

namespace {

const engine_option & find(std::string_view key) {
    for (const engine_option & r : table()) {
        if (key == r.key || key == r.flag()) {
            return r;
        }
    }
    throw option_error("", "unknown engine option '" + std::string(key) + "'");
}

}  // namespace

void set_engine_option(session_options & o, std::string_view key, const option_value & value) {
    const engine_option & r = find(key);
    r.set(r, o, checked_value(r, value));
}

std::string engine_option_name(std::string_view key) { return "--" + find(key).flag(); }

option_value get_engine_option(const session_options & o, std::string_view key) {
    const engine_option & r = find(key);
    return r.get(r, o);
}

std::vector<std::pair<std::string, option_value>> recorded_engine_options(const session_options & o) {
    static const session_options                      defaults;
    std::vector<std::pair<std::string, option_value>> out;
    for (const engine_option & r : table()) {
        const option_value v = r.get(r, o);
        if (r.record == option_record::always || (r.record == unless_default && v != r.get(r, defaults))) {
            out.emplace_back(std::string(r.key), v);
        }
    }
    return out;
}

}  // namespace ecokv::llama
