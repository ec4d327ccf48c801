#include "tiny-model.h"

#include "seeded-random.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>

namespace ecokv::test {

namespace {

bool ends_with(const std::string & s, const std::string & suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string & s, const std::string & prefix) {
    return s.compare(0, prefix.size(), prefix) == 0;
}

// "blk.3.attn_q.weight" -> "attn_q.weight"; other names unchanged.
std::string layer_suffix(const std::string & name) {
    if (!starts_with(name, "blk.")) {
        return name;
    }
    const size_t dot = name.find('.', 4);
    return dot == std::string::npos ? name : name.substr(dot + 1);
}

// ---- model construction --------------------------------------------------------------------------------------

enum class init_kind { normal, norm, one, zero, unknown };

struct init_rule {
    init_kind kind  = init_kind::unknown;
    double    stdev = 0.0;
};

init_rule rule_for(const tiny_config & c, const std::string & name, int64_t fan_in_elems) {
    const std::string s       = layer_suffix(name);
    const double      fan_in  = double(fan_in_elems);
    const bool        qkv_bias = c.arch == "qwen2" || c.arch == "qwen2vl";  // the archs whose real models have them

    if (ends_with(s, ".scale") || ends_with(s, ".input_scale") || starts_with(s, "rope_freqs") ||
        starts_with(s, "rope_factors")) {
        return { init_kind::one };
    }
    if (s == "token_embd.weight") {
        return { init_kind::normal, 1.0 };
    }
    if (s == "output.weight") {
        return { init_kind::normal, 1.0 / std::sqrt(fan_in) };
    }
    if (s == "output_norm.weight" || s == "attn_norm.weight" || s == "ffn_norm.weight" ||
        s == "attn_q_norm.weight" || s == "attn_k_norm.weight" || s == "post_attention_norm.weight" ||
        s == "post_ffw_norm.weight") {
        return { init_kind::norm, 0.1 };
    }
    if (s == "cls.output.weight") {  // qwen3vl's rerank head: created, never used for generation
        return { init_kind::zero };
    }
    if (s == "attn_q.weight" || s == "attn_k.weight") {
        return { init_kind::normal, 1.3 / std::sqrt(fan_in) };
    }
    if (s == "attn_v.weight" || s == "attn_output.weight" || s == "ffn_gate.weight" || s == "ffn_up.weight" ||
        s == "ffn_down.weight") {
        return { init_kind::normal, 1.0 / std::sqrt(fan_in) };
    }
    if (s == "attn_q.bias" || s == "attn_k.bias" || s == "attn_v.bias") {
        return qkv_bias ? init_rule{ init_kind::normal, 0.2 } : init_rule{ init_kind::zero };
    }
    if (ends_with(s, ".bias")) {
        return { init_kind::zero };
    }
    return { init_kind::unknown };
}

// Values [first, first + n) of a tensor: element i is the (i+1)-th normal() of the tensor's stream. splitmix64 adds
// its constant gamma to the state per next() and normal() draws twice, so element i starts from state + 2 i gamma:
// chunks can be filled in any order, on any thread, with the values of one sequential pass.
void fill_values(const init_rule & r, uint64_t stream, int64_t first, int64_t n, float * out) {
    constexpr uint64_t gamma = 0x9e3779b97f4a7c15ull;  // splitmix64::next()'s increment (seeded-random.h)
    splitmix64         rng{ stream + 2 * uint64_t(first) * gamma };
    for (int64_t i = 0; i < n; ++i) {
        switch (r.kind) {
            case init_kind::normal: out[i] = float(r.stdev * rng.normal()); break;
            case init_kind::norm: out[i] = float(1.0 + r.stdev * rng.normal()); break;
            case init_kind::one: out[i] = 1.0f; break;
            case init_kind::zero:
            case init_kind::unknown: out[i] = 0.0f; break;
        }
    }
}

struct builder {
    tiny_config                          cfg;
    std::map<std::string, tiny_tensor> * out = nullptr;  // the F32 copies, or null
    uint64_t                             bytes_total = 0, bytes_done = 0;
    int64_t                              n_params = 0;
    std::vector<std::string>             unknown;
    std::vector<std::string>             bad_type;
    std::string                          error;  // an exception caught inside the llama.cpp callback
};

// Fills rows [r0, r0 + nr) of t: F32 values into `f` (the F32 copy's rows when kept, else scratch), converted to the
// tensor's type in `conv` and written; a kept copy is replaced by what was stored (F16-rounded, dequantized).
void fill_rows(ggml_tensor * t, const init_rule & r, uint64_t stream, int64_t r0, int64_t nr, float * f,
               std::vector<uint8_t> & conv, bool keep) {
    const int64_t n_row  = t->ne[0];
    const size_t  row_sz = ggml_row_size(t->type, n_row);
    fill_values(r, stream, r0 * n_row, nr * n_row, f);
    const void * src = f;
    if (t->type != GGML_TYPE_F32) {
        conv.resize(size_t(nr) * row_sz);
        if (t->type == GGML_TYPE_F16) {
            ggml_fp32_to_fp16_row(f, reinterpret_cast<ggml_fp16_t *>(conv.data()), nr * n_row);
        } else {
            ggml_quantize_chunk(t->type, f, conv.data(), 0, nr, n_row, nullptr);
        }
        if (keep) {
            ggml_get_type_traits(t->type)->to_float(conv.data(), f, nr * n_row);
        }
        src = conv.data();
    }
    ggml_backend_tensor_set(t, src, size_t(r0) * row_sz, size_t(nr) * row_sz);
}

void fill_tensor(builder & b, ggml_tensor * t) {
    const std::string name = ggml_get_name(t);
    const init_rule   r    = rule_for(b.cfg, name, t->ne[0]);
    if (r.kind == init_kind::unknown) {
        b.unknown.push_back(name);  // left at 0; make_tiny_model throws after loading
    }
    const bool quant = ggml_is_quantized(t->type);
    if ((t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && !quant) ||
        (quant && t->ne[0] % ggml_blck_size(t->type) != 0)) {
        b.bad_type.push_back(name);
        return;
    }
    const int64_t n_row = t->ne[0], n_rows = ggml_nrows(t);
    tiny_tensor   tt;
    if (b.out) {
        std::copy(t->ne, t->ne + 4, tt.ne.begin());
        tt.data.assign(size_t(ggml_nelements(t)), 0.0f);
    }

    // work items of about 64 Ki values, whole rows (quantization blocks never straddle two items)
    const int64_t  chunk    = std::max<int64_t>(1, 65536 / n_row);
    const int64_t  n_chunks = (n_rows + chunk - 1) / chunk;
    const int      nth      = int(std::clamp<int64_t>(b.cfg.n_threads, 1, n_chunks));
    const uint64_t stream   = b.cfg.seed ^ fnv1a(name);
    auto           work     = [&](int ith) {
        std::vector<float>   scratch(b.out ? 0 : size_t(chunk * n_row));
        std::vector<uint8_t> conv;
        for (int64_t ic = ith; ic < n_chunks; ic += nth) {
            const int64_t r0 = ic * chunk, nr = std::min(chunk, n_rows - r0);
            float *       f  = b.out ? tt.data.data() + r0 * n_row : scratch.data();
            fill_rows(t, r, stream, r0, nr, f, conv, b.out != nullptr);
        }
    };
    std::vector<std::thread> pool;
    for (int ith = 1; ith < nth; ++ith) {
        pool.emplace_back(work, ith);
    }
    work(0);
    for (auto & th : pool) {
        th.join();
    }

    b.n_params += ggml_nelements(t);
    b.bytes_done += ggml_nbytes(t);
    if (b.out) {
        (*b.out)[name] = std::move(tt);
    }
    if (b.cfg.on_progress) {
        b.cfg.on_progress(b.bytes_done, std::max(b.bytes_total, b.bytes_done));
    }
}

void set_tensor_data(ggml_tensor * t, void * ud) {
    builder & b = *static_cast<builder *>(ud);
    try {
        fill_tensor(b, t);
    } catch (const std::exception & e) {  // never through llama.cpp's C code
        if (b.error.empty()) {
            b.error = std::string(ggml_get_name(t)) + ": " + e.what();
        }
    }
}

struct gguf_deleter {
    void operator()(gguf_context * c) const { gguf_free(c); }
};

ggml_type matrix_type(const std::string & name) {
    if (name == "f32") {
        return GGML_TYPE_F32;
    }
    if (name == "f16") {
        return GGML_TYPE_F16;
    }
    if (name == "q8_0") {
        return GGML_TYPE_Q8_0;
    }
    if (name == "q4_0") {
        return GGML_TYPE_Q4_0;
    }
    throw std::invalid_argument("tiny_model: weight_type must be f32, f16, q8_0 or q4_0, not " + name);
}

// Declares a matrix's type: a model built from user data takes each tensor's type from the gguf context
// (src/llama-model-loader.cpp, create_tensor with no files), F32 when it is not declared.
void declare(gguf_context * g, const std::string & name, int64_t ne0, int64_t ne1, ggml_type type) {
    if (ggml_is_quantized(type) && ne0 % ggml_blck_size(type) != 0) {
        type = GGML_TYPE_F32;
    }
    ggml_tensor t;
    std::memset(&t, 0, sizeof t);
    t.type  = type;
    t.ne[0] = ne0, t.ne[1] = ne1, t.ne[2] = 1, t.ne[3] = 1;
    t.nb[0] = ggml_type_size(type);
    t.nb[1] = ggml_row_size(type, ne0);
    t.nb[2] = t.nb[3] = t.nb[1] * size_t(ne1);
    ggml_set_name(&t, name.c_str());
    gguf_add_tensor(g, &t);
}

// Every matrix in weight_type (as a quantized GGUF of a real model). Nothing is declared for f32, the default.
void declare_matrices(gguf_context * g, const tiny_config & c) {
    const ggml_type wt = matrix_type(c.weight_type);
    if (wt == GGML_TYPE_F32) {
        return;
    }
    const int64_t n_kv = int64_t(c.n_head_kv) * c.head_dim();
    declare(g, "token_embd.weight", c.n_embd, c.n_vocab, wt);
    declare(g, "output.weight", c.n_embd, c.n_vocab, wt);
    for (int32_t il = 0; il < c.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        declare(g, p + "attn_q.weight", c.n_embd, c.n_embd, wt);
        declare(g, p + "attn_k.weight", c.n_embd, n_kv, wt);
        declare(g, p + "attn_v.weight", c.n_embd, n_kv, wt);
        declare(g, p + "attn_output.weight", c.n_embd, c.n_embd, wt);
        declare(g, p + "ffn_gate.weight", c.n_embd, c.n_ff, wt);
        declare(g, p + "ffn_up.weight", c.n_embd, c.n_ff, wt);
        declare(g, p + "ffn_down.weight", c.n_ff, c.n_embd, wt);
    }
}

// Bytes of every weight llama.cpp will create, for progress: the matrices as declared, the rest (norms, biases,
// scales) a rough F32 estimate.
uint64_t weight_bytes_estimate(const gguf_context * g, const tiny_config & c) {
    uint64_t total = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        total += gguf_get_tensor_size(g, i);
    }
    if (total == 0) {  // f32: nothing declared
        const uint64_t d = uint64_t(c.n_embd), kv = uint64_t(c.n_head_kv) * uint64_t(c.head_dim());
        total = 4 * (2 * d * uint64_t(c.n_vocab) + uint64_t(c.n_layer) * (2 * d * d + 2 * d * kv + 3 * d * c.n_ff));
    }
    return total;
}

// GPT-2's byte-level alphabet: byte b is the character b where printable, else U+0100 + (its rank among the others).
std::string byte_piece(int32_t b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    int32_t    cp        = b;
    if (!printable) {
        cp = 256;
        for (int32_t x = 0; x < b; ++x) {
            cp += (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174 ? 0 : 1;
        }
    }
    return cp < 0x80 ? std::string(1, char(cp))
                     : std::string{ char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F)) };  // cp < 0x800
}

// A byte-level BPE vocabulary (tokenizer "gpt2") without merges but one: every byte is a token, so any text
// tokenizes; then the pieces projectors look up by text (Idefics3's "\n\n", <fake_token_around_image>,
// <global-img>) and a chat template's control tokens; <unused_i> fill up to n_vocab.
void set_bpe_vocab(gguf_context * g, int32_t n_vocab) {
    std::vector<std::string> words;
    std::vector<int32_t>     types;
    for (int32_t b = 0; b < 256; ++b) {
        words.push_back(byte_piece(b));
        types.push_back(1);  // LLAMA_TOKEN_TYPE_NORMAL
    }
    words.push_back(byte_piece('\n') + byte_piece('\n'));
    types.push_back(1);
    for (const char * special : { "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<global-img>",
                                  "<end_of_utterance>" }) {
        words.push_back(special);
        types.push_back(3);  // LLAMA_TOKEN_TYPE_CONTROL
    }
    if (int32_t(words.size()) > n_vocab) {
        throw std::invalid_argument("tiny_model: the bpe tokenizer needs n_vocab >= " + std::to_string(words.size()));
    }
    for (int32_t i = int32_t(words.size()); i < n_vocab; ++i) {
        words.push_back("<unused_" + std::to_string(i) + ">");
        types.push_back(5);  // LLAMA_TOKEN_TYPE_UNUSED
    }
    std::vector<const char *> ptrs;
    for (const std::string & w : words) {
        ptrs.push_back(w.c_str());
    }
    const std::string merge = byte_piece('\n') + " " + byte_piece('\n');
    const char *      merges[] = { merge.c_str() };
    gguf_set_val_str(g, "tokenizer.ggml.model", "gpt2");
    gguf_set_val_str(g, "tokenizer.ggml.pre", "default");
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", ptrs.data(), ptrs.size());
    gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(), types.size());
    gguf_set_arr_str(g, "tokenizer.ggml.merges", merges, 1);
    gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", 257);  // <|im_start|>
    gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", 258);  // <|im_end|>
    gguf_set_val_bool(g, "tokenizer.ggml.add_bos_token", false);
}

std::unique_ptr<gguf_context, gguf_deleter> make_metadata(const tiny_config & c) {
    std::unique_ptr<gguf_context, gguf_deleter> g(gguf_init_empty());
    const std::string a = c.arch;
    auto k = [&](const char * key) { return a + "." + key; };

    gguf_set_val_str(g.get(), "general.architecture", a.c_str());
    gguf_set_val_str(g.get(), "general.name", ("ecokv-tiny-" + a).c_str());
    gguf_set_val_u32(g.get(), k("vocab_size").c_str(), uint32_t(c.n_vocab));
    gguf_set_val_u32(g.get(), k("context_length").c_str(), uint32_t(c.n_ctx_train));
    gguf_set_val_u32(g.get(), k("embedding_length").c_str(), uint32_t(c.n_embd));
    gguf_set_val_u32(g.get(), k("block_count").c_str(), uint32_t(c.n_layer));
    gguf_set_val_u32(g.get(), k("feed_forward_length").c_str(), uint32_t(c.n_ff));
    gguf_set_val_u32(g.get(), k("attention.head_count").c_str(), uint32_t(c.n_head));
    gguf_set_val_u32(g.get(), k("attention.head_count_kv").c_str(), uint32_t(c.n_head_kv));
    gguf_set_val_f32(g.get(), k("attention.layer_norm_rms_epsilon").c_str(), 1e-5f);
    gguf_set_val_f32(g.get(), k("rope.freq_base").c_str(), c.rope_freq_base);
    if (c.arch == "qwen2vl" || c.arch == "qwen3vl") {
        gguf_set_arr_data(g.get(), k("rope.dimension_sections").c_str(), GGUF_TYPE_INT32, c.rope_sections.data(), 4);
    }
    if (c.arch == "qwen3vl") {
        gguf_set_val_u32(g.get(), k("n_deepstack_layers").c_str(), uint32_t(c.n_deepstack_layers));
    }
    if (c.arch == "gemma3" && c.sliding_window > 0) {  // no key: llama.cpp's gemma3 has no SWA at all
        gguf_set_val_u32(g.get(), k("attention.sliding_window").c_str(), uint32_t(c.sliding_window));
        gguf_set_val_u32(g.get(), k("attention.sliding_window_pattern").c_str(), uint32_t(c.swa_pattern));
        gguf_set_val_f32(g.get(), k("rope.freq_base_swa").c_str(), c.rope_freq_base_swa);
    }

    if (c.tokenizer == "bpe") {
        set_bpe_vocab(g.get(), c.n_vocab);
    } else {  // dummy tokenizer (upstream tests/test-llama-archs.cpp): no special tokens, ids are fed directly
        std::vector<std::string>  words(size_t(c.n_vocab));
        std::vector<const char *> ptrs(size_t(c.n_vocab));
        std::vector<float>        scores(size_t(c.n_vocab), 0.0f);
        for (int32_t i = 0; i < c.n_vocab; ++i) {
            words[size_t(i)] = "tok_" + std::to_string(i);
            ptrs[size_t(i)]  = words[size_t(i)].c_str();
        }
        gguf_set_val_str(g.get(), "tokenizer.ggml.model", "test");
        gguf_set_arr_str(g.get(), "tokenizer.ggml.tokens", ptrs.data(), ptrs.size());
        gguf_set_arr_data(g.get(), "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(), scores.size());
    }
    if (!c.chat_template.empty()) {
        gguf_set_val_str(g.get(), "tokenizer.chat_template", c.chat_template.c_str());
    }
    declare_matrices(g.get(), c);
    return g;
}

void validate(const tiny_config & c) {
    if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen2vl" && c.arch != "qwen3vl" && c.arch != "gemma3") {
        throw std::invalid_argument("tiny_model: arch must be llama, qwen2, qwen2vl, qwen3vl or gemma3, not " + c.arch);
    }
    if (c.n_layer <= 0 || c.n_embd <= 0 || c.n_head <= 0 || c.n_head_kv <= 0 || c.n_ff <= 0 || c.n_vocab <= 0 ||
        c.n_ctx_train <= 0) {
        throw std::invalid_argument("tiny_model: sizes must be positive");
    }
    if (c.n_embd % c.n_head != 0 || c.n_head % c.n_head_kv != 0 || c.head_dim() % 2 != 0) {
        throw std::invalid_argument("tiny_model: need n_embd % n_head == 0, n_head % n_head_kv == 0, even head_dim");
    }
    if (c.arch == "qwen2vl" || c.arch == "qwen3vl") {
        const auto & s = c.rope_sections;
        if (s[0] < 0 || s[1] < 0 || s[2] < 0 || s[3] != 0 || s[0] + s[1] + s[2] <= 0 ||
            s[0] + s[1] + s[2] > c.head_dim()) {
            throw std::invalid_argument("tiny_model: rope_sections must be >= 0 with sections[3] == 0 and a sum in "
                                        "(0, head_dim]");
        }
    }
    if (c.arch == "qwen3vl" && (c.n_deepstack_layers < 0 || c.n_deepstack_layers >= c.n_layer)) {
        throw std::invalid_argument("tiny_model: n_deepstack_layers must be in [0, n_layer)");
    }
    if (c.arch == "gemma3" && (c.sliding_window < 0 || (c.sliding_window > 0 && c.swa_pattern < 2) ||
                               !(c.rope_freq_base_swa > 0))) {
        throw std::invalid_argument("tiny_model: gemma3 needs sliding_window >= 0, swa_pattern >= 2 and "
                                    "rope_freq_base_swa > 0");
    }
    if (c.tokenizer != "test" && c.tokenizer != "bpe") {
        throw std::invalid_argument("tiny_model: tokenizer must be test or bpe, not " + c.tokenizer);
    }
    matrix_type(c.weight_type);
    if (c.n_threads < 1) {
        throw std::invalid_argument("tiny_model: n_threads must be at least 1");
    }
}

// ---- reference helpers ---------------------------------------------------------------------------------------

using vecd = std::vector<double>;

// y[o] = sum_i W[o][i] x[i] (+ b[o]); W is {n_in, n_out} in ggml order.
vecd matvec(const tiny_tensor & w, const vecd & x, const tiny_tensor * b = nullptr) {
    const size_t n_in = size_t(w.ne[0]), n_out = size_t(w.ne[1]);
    if (x.size() != n_in) {
        throw std::logic_error("reference: matvec size mismatch");
    }
    vecd y(n_out, 0.0);
    for (size_t o = 0; o < n_out; ++o) {
        const float * row = w.data.data() + o * n_in;
        double        acc = 0.0;
        for (size_t i = 0; i < n_in; ++i) {
            acc += double(row[i]) * x[i];
        }
        y[o] = acc + (b ? double(b->data[o]) : 0.0);
    }
    return y;
}

double scalar_or_one(const tiny_model & m, const std::string & name) {
    const tiny_tensor * t = m.find(name);
    return t ? double(t->data[0]) : 1.0;
}

// llama.cpp multiplies a matmul result by its optional "<w>.scale"; they are 1 here but honour them anyway.
vecd linear(const tiny_model & m, const std::string & w, const vecd & x, const std::string & bias = "") {
    vecd         y = matvec(m.tensor(w + ".weight"), x);
    const double s = scalar_or_one(m, w + ".scale");
    const tiny_tensor * b = bias.empty() ? nullptr : m.find(bias);
    for (size_t o = 0; o < y.size(); ++o) {
        y[o] = y[o] * s + (b ? double(b->data[o]) : 0.0);
    }
    return y;
}

// x[0..n) = x / rms(x) * w, in place (ggml_rms_norm then the weight, as llama.cpp's build_norm).
void rms_norm_in_place(double * x, int32_t n, const tiny_tensor & w, double eps) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; ++i) {
        ss += x[i] * x[i];
    }
    const double scale = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int32_t i = 0; i < n; ++i) {
        x[i] *= scale * double(w.data[size_t(i)]);
    }
}

vecd rms_norm(const vecd & x, const tiny_tensor & w, double eps) {
    vecd y = x;
    rms_norm_in_place(y.data(), int32_t(y.size()), w, eps);
    return y;
}

// How an arch rotates (llama_model_rope_type): NORM = LLAMA_ROPE_TYPE_NORM, adjacent pairs (2i, 2i+1); the others
// rotate NEOX pairs (i, i + d/2): NEOX with 1-D positions, MROPE with contiguous (t, y, x) sections, IMROPE with
// interleaved ones.
enum class rope_kind { norm, neox, mrope, imrope };

rope_kind rope_kind_of(const std::string & arch) {
    if (arch == "llama") {
        return rope_kind::norm;
    }
    if (arch == "qwen2vl") {
        return rope_kind::mrope;
    }
    if (arch == "qwen3vl") {
        return rope_kind::imrope;
    }
    return rope_kind::neox;  // qwen2, gemma3
}

// The position pair i of a head rotates by (ggml_mrope_cache_init, ggml-cpu/ops.cpp): plane t, y or x, or plane 3,
// which llama.cpp always sets to 0 (llm_graph_input_pos::set_input for tokens, mtmd / decode_prompt for embeddings).
int32_t rope_position(int32_t i, const position & p, const std::array<int32_t, 4> & s, rope_kind kind) {
    if (kind != rope_kind::mrope && kind != rope_kind::imrope) {
        return p[0];
    }
    const int32_t sector = i % (s[0] + s[1] + s[2] + s[3]);
    if (kind == rope_kind::imrope) {
        if (sector % 3 == 1 && sector < 3 * s[1]) {
            return p[1];
        }
        if (sector % 3 == 2 && sector < 3 * s[2]) {
            return p[2];
        }
        if (sector % 3 == 0 && sector < 3 * s[0]) {
            return p[0];
        }
        return 0;  // plane 3
    }
    if (sector >= s[0] && sector < s[0] + s[1]) {
        return p[1];  // plane 1 = y
    }
    if (sector >= s[0] + s[1] && sector < s[0] + s[1] + s[2]) {
        return p[2];  // plane 2 = x
    }
    return sector < s[0] ? p[0] : 0;  // sector >= s0+s1+s2: plane 3 (validate() keeps qwen2vl's sections off it)
}

// Rotates one head vector (head_dim values) in place, as ggml_rope_ext / ggml_rope_multi on CPU with
// freq_scale = 1, ext_factor = 0, attn_factor = 1 and no freq factors.
void rope_head(double * v, int32_t d, const position & p, const std::array<int32_t, 4> & sections, rope_kind kind,
               double base) {
    const int32_t half = d / 2;
    const bool    neox = kind != rope_kind::norm;
    for (int32_t i = 0; i < half; ++i) {
        const int32_t pos   = rope_position(i, p, sections, kind);
        const double  theta = double(pos) * std::pow(base, -2.0 * double(i) / double(d));
        const double  cs = std::cos(theta), sn = std::sin(theta);
        const int32_t a = neox ? i : 2 * i;  // NEOX pairs (i, i + d/2) vs NORM pairs (2i, 2i + 1)
        const int32_t b = neox ? i + half : 2 * i + 1;
        const double  x0 = v[a], x1 = v[b];
        v[a]             = x0 * cs - x1 * sn;
        v[b]             = x0 * sn + x1 * cs;
    }
}

double silu(double x) {
    return x / (1.0 + std::exp(-x));
}

// GELU, tanh approximation (ggml_gelu; gemma3's LLM_FFN_GELU).
double gelu_tanh(double x) {
    constexpr double sqrt_2_over_pi = 0.7978845608028654;
    return 0.5 * x * (1.0 + std::tanh(sqrt_2_over_pi * x * (1.0 + 0.044715 * x * x)));
}

}  // namespace

// ---- tiny_model ------------------------------------------------------------------------------------------------

tiny_model::tiny_model(tiny_model && o) noexcept :
    model_(std::exchange(o.model_, nullptr)),
    config_(std::move(o.config_)),
    rms_eps_(o.rms_eps_),
    n_params_(o.n_params_),
    n_bytes_(o.n_bytes_),
    tensors_(std::move(o.tensors_)) {}

tiny_model & tiny_model::operator=(tiny_model && o) noexcept {
    if (this != &o) {
        if (model_) {
            llama_model_free(model_);
        }
        model_   = std::exchange(o.model_, nullptr);
        config_  = std::move(o.config_);
        rms_eps_  = o.rms_eps_;
        n_params_ = o.n_params_;
        n_bytes_  = o.n_bytes_;
        tensors_  = std::move(o.tensors_);
    }
    return *this;
}

llama_model * tiny_model::release() {
    return std::exchange(model_, nullptr);
}

tiny_model::~tiny_model() {
    if (model_) {
        llama_model_free(model_);
    }
}

const tiny_tensor * tiny_model::find(const std::string & name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

const tiny_tensor & tiny_model::tensor(const std::string & name) const {
    const tiny_tensor * t = find(name);
    if (!t) {
        throw std::out_of_range("tiny_model: no tensor " + name);
    }
    return *t;
}

const float * tiny_model::embedding(int32_t token) const {
    if (token < 0 || token >= config_.n_vocab) {
        throw std::out_of_range("tiny_model: token id out of range");
    }
    return tensor("token_embd.weight").data.data() + size_t(token) * size_t(config_.n_embd);
}

std::vector<float> tiny_model::input_embedding(int32_t token) const {
    const int32_t      n_embd = config_.n_embd;
    const float *      e      = embedding(token);
    std::vector<float> out(e, e + n_embd);
    out.reserve(size_t(n_embd_inp()));
    for (int32_t k = 0; int32_t(out.size()) < n_embd_inp(); ++k) {
        const float * part = embedding((token + 17 * (k + 1)) % config_.n_vocab);
        for (int32_t i = 0; i < n_embd; ++i) {
            out.push_back(0.5f * part[i]);
        }
    }
    return out;
}

int32_t tiny_model::n_embd_inp() const {
    return config_.n_embd * (1 + (config_.arch == "qwen3vl" ? config_.n_deepstack_layers : 0));
}

int32_t tiny_model::n_swa() const {
    return config_.arch == "gemma3" ? config_.sliding_window : 0;
}

bool tiny_model::is_swa(int32_t il) const {
    return n_swa() > 0 && il % config_.swa_pattern < config_.swa_pattern - 1;
}

int32_t tiny_config::test_gpu_layers() {
    const char * ngl = std::getenv("ECOKV_TEST_NGL");
    return ngl && *ngl ? int32_t(std::strtol(ngl, nullptr, 10)) : 0;
}

tiny_model make_tiny_model(const tiny_config & cfg) {
    validate(cfg);
    llama_backend_init();

    tiny_model m;
    m.config_  = cfg;
    m.rms_eps_ = cfg.arch == "qwen2vl" ? 0.0 : double(1e-5f);

    auto    meta = make_metadata(cfg);
    builder b;
    b.cfg         = cfg;
    b.out         = cfg.keep_reference_weights ? &m.tensors_ : nullptr;
    b.bytes_total = weight_bytes_estimate(meta.get(), cfg);

    llama_model_params  params = llama_model_default_params();
    params.n_gpu_layers        = cfg.n_gpu_layers;
    params.progress_callback   = [](float, void *) { return true; };
    m.model_ = llama_model_init_from_user(meta.get(), set_tensor_data, &b, params);
    if (!m.model_) {
        throw std::runtime_error("tiny_model: llama_model_init_from_user failed for arch " + cfg.arch +
                                 (b.error.empty() ? "" : " (" + b.error + ")"));
    }
    if (!b.error.empty()) {
        throw std::runtime_error("tiny_model: " + b.error);
    }
    if (!b.unknown.empty() || !b.bad_type.empty()) {
        std::string msg = "tiny_model: llama.cpp created tensors this builder cannot initialise:";
        for (const auto & n : b.unknown) {
            msg += " " + n;
        }
        for (const auto & n : b.bad_type) {
            msg += " " + n + "(type)";
        }
        throw std::runtime_error(msg);  // ~tiny_model frees the model
    }
    if (llama_model_n_head(m.model_) != cfg.n_head || llama_model_n_head_kv(m.model_) != cfg.n_head_kv ||
        llama_model_n_layer(m.model_) != cfg.n_layer || llama_model_n_embd(m.model_) != cfg.n_embd ||
        llama_model_n_embd_inp(m.model_) != m.n_embd_inp() || llama_model_n_swa(m.model_) != m.n_swa()) {
        throw std::runtime_error("tiny_model: llama.cpp read back different hyperparameters");
    }
    m.n_params_ = b.n_params;  // llama_model_n_params / llama_model_size report 0 for a model built from user data
    m.n_bytes_  = b.bytes_done;
    return m;
}

// ---- positions -------------------------------------------------------------------------------------------------

std::vector<position> text_positions(int32_t n, int32_t t0) {
    std::vector<position> p(size_t(std::max(n, 0)));
    for (int32_t i = 0; i < n; ++i) {
        p[size_t(i)] = { t0 + i, t0 + i, t0 + i };
    }
    return p;
}

std::vector<position> image_positions(int32_t t, int32_t nx, int32_t ny) {
    std::vector<position> p;
    p.reserve(size_t(std::max(nx * ny, 0)));
    for (int32_t i = 0; i < nx * ny; ++i) {
        p.push_back({ t, t + i / nx, t + i % nx });
    }
    return p;
}

// ---- reference -------------------------------------------------------------------------------------------------

namespace {

// A row through ggml's encoding of `type` and back.
std::function<void(double *, int32_t)> round_through(ggml_type type) {
    if (type == GGML_TYPE_F32) {
        return {};
    }
    const ggml_from_float_t to   = ggml_get_type_traits_cpu(type)->from_float;
    const ggml_to_float_t   from = ggml_get_type_traits(type)->to_float;
    if (to == nullptr || from == nullptr) {
        throw std::invalid_argument(std::string("reference: no CPU conversion for ") + ggml_type_name(type));
    }
    return [=](double * row, int32_t n) {
        std::vector<float>   f(row, row + n), back(static_cast<size_t>(n));
        std::vector<uint8_t> blocks(ggml_row_size(type, n));
        to(f.data(), blocks.data(), n);
        from(blocks.data(), back.data(), n);
        std::copy(back.begin(), back.end(), row);
    };
}

}  // namespace

kv_rounding cache_rounding(int32_t k_type, int32_t v_type) {
    const auto k = ggml_type(k_type);
    return { round_through(ggml_get_type_traits_cpu(k)->vec_dot_type), round_through(k), round_through(ggml_type(v_type)) };
}

std::vector<bool> embedding_tokens(const tiny_model & m, const std::vector<position> & positions,
                                   const input_embeddings & inputs) {
    const int32_t n = int32_t(positions.size());
    if (!inputs.empty() && inputs.size() != positions.size()) {
        throw std::invalid_argument("tiny_model: need one input embedding entry per token (or none)");
    }
    std::vector<bool> out(size_t(n), false);
    for (int32_t i = 0; i < n; ++i) {
        const position & p = positions[size_t(i)];
        // an M-RoPE token is image-like when its y/x differ from t or a neighbour shares its t (an image block)
        const bool shared = (i > 0 && positions[size_t(i - 1)][0] == p[0]) ||
                            (i + 1 < n && positions[size_t(i + 1)][0] == p[0]);
        const bool image  = m.mrope() && (p[1] != p[0] || p[2] != p[0] || shared);
        out[size_t(i)]    = image || (!inputs.empty() && !inputs[size_t(i)].empty());
    }
    return out;
}

namespace {

// What token i enters the first layer with: the layer input x0 (n_embd) and, for qwen3vl, the deepstack parts that
// layers 0 .. n_deepstack_layers-1 add to their outputs (zero for token inputs, as llama.cpp's ggml_pad).
struct reference_input {
    vecd              x0;
    std::vector<vecd> deepstack;
};

std::vector<reference_input> reference_inputs(const tiny_model & m, const std::vector<int32_t> & tokens,
                                              const std::vector<position> & positions,
                                              const input_embeddings & inputs) {
    const tiny_config &     c      = m.config();
    const int32_t           n_embd = c.n_embd, n_ds = m.n_embd_inp() / n_embd - 1;
    const std::vector<bool> embd   = embedding_tokens(m, positions, inputs);
    // gemma3 scales token inputs only: ggml_scale(inp, ubatch.token ? sqrtf(n_embd) : 1)
    const double token_scale = c.arch == "gemma3" ? double(std::sqrt(float(n_embd))) : 1.0;

    std::vector<reference_input> out(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        reference_input & r = out[i];
        r.deepstack.assign(size_t(n_ds), vecd(size_t(n_embd), 0.0));
        if (!embd[i]) {
            const float * e = m.embedding(tokens[i]);
            r.x0.resize(size_t(n_embd));
            for (int32_t j = 0; j < n_embd; ++j) {
                r.x0[size_t(j)] = double(e[j]) * token_scale;
            }
            continue;
        }
        const std::vector<float> dflt = inputs.empty() || inputs[i].empty() ? m.input_embedding(tokens[i])
                                                                            : std::vector<float>{};
        const std::vector<float> & e  = dflt.empty() ? inputs[i] : dflt;
        if (int32_t(e.size()) != m.n_embd_inp()) {
            throw std::invalid_argument("reference: an input embedding needs n_embd_inp floats");
        }
        r.x0.assign(e.begin(), e.begin() + n_embd);
        for (int32_t k = 0; k < n_ds; ++k) {
            r.deepstack[size_t(k)].assign(e.begin() + (k + 1) * n_embd, e.begin() + (k + 2) * n_embd);
        }
    }
    return out;
}

}  // namespace

reference_output reference_forward(const tiny_model & m, const std::vector<int32_t> & tokens,
                                   const std::vector<position> & positions, const keep_fn & keep,
                                   const kv_rounding & rounding, const input_embeddings & inputs,
                                   const std::vector<int32_t> & blocks) {
    const tiny_config & c = m.config();
    const int32_t       n = int32_t(tokens.size());
    if (n == 0 || positions.size() != tokens.size()) {
        throw std::invalid_argument("reference: need one position per token and at least one token");
    }
    if (!blocks.empty() && blocks.size() != tokens.size()) {
        throw std::invalid_argument("reference: need one non-causal block id per token (or none)");
    }
    // key j is visible to query i in token order, or both in one non-causal block (later keys too)
    auto in_order = [&](int32_t i, int32_t j) {
        return j <= i || (!blocks.empty() && blocks[size_t(i)] >= 0 && blocks[size_t(j)] == blocks[size_t(i)]);
    };
    const int32_t   d = c.head_dim(), n_embd = c.n_embd, n_kv = c.n_head_kv, group = c.n_head / c.n_head_kv;
    const rope_kind rope   = rope_kind_of(c.arch);
    const bool      gemma3 = c.arch == "gemma3";
    const bool      qk_norm = gemma3 || c.arch == "qwen3vl";
    const double    eps    = m.rms_eps();
    const double    scale  = 1.0 / std::sqrt(double(d));

    const std::vector<reference_input> in = reference_inputs(m, tokens, positions, inputs);
    std::vector<vecd>                  x(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
        x[size_t(i)] = in[size_t(i)].x0;
    }

    reference_output out;
    out.kv.resize(size_t(c.n_layer));

    for (int32_t il = 0; il < c.n_layer; ++il) {
        const std::string blk  = "blk." + std::to_string(il) + ".";
        const bool        swa  = m.is_swa(il);
        const double      base = double(swa ? c.rope_freq_base_swa : c.rope_freq_base);

        std::vector<vecd> q(static_cast<size_t>(n)), k(static_cast<size_t>(n)), v(static_cast<size_t>(n));
        for (int32_t i = 0; i < n; ++i) {
            const vecd h = rms_norm(x[size_t(i)], m.tensor(blk + "attn_norm.weight"), eps);
            q[size_t(i)] = linear(m, blk + "attn_q", h, blk + "attn_q.bias");
            k[size_t(i)] = linear(m, blk + "attn_k", h, blk + "attn_k.bias");
            v[size_t(i)] = linear(m, blk + "attn_v", h, blk + "attn_v.bias");
            for (int32_t hh = 0; hh < c.n_head; ++hh) {
                double * row = q[size_t(i)].data() + size_t(hh * d);
                qk_norm ? rms_norm_in_place(row, d, m.tensor(blk + "attn_q_norm.weight"), eps) : void();
                rope_head(row, d, positions[size_t(i)], c.rope_sections, rope, base);
            }
            for (int32_t g = 0; g < n_kv; ++g) {
                double * row = k[size_t(i)].data() + size_t(g * d);
                qk_norm ? rms_norm_in_place(row, d, m.tensor(blk + "attn_k_norm.weight"), eps) : void();
                rope_head(row, d, positions[size_t(i)], c.rope_sections, rope, base);
            }
            for (int32_t hh = 0; rounding.q && hh < c.n_head; ++hh) {
                rounding.q(q[size_t(i)].data() + size_t(hh * d), d);
            }
            for (int32_t g = 0; g < n_kv; ++g) {
                rounding.k ? rounding.k(k[size_t(i)].data() + size_t(g * d), d) : void();
                rounding.v ? rounding.v(v[size_t(i)].data() + size_t(g * d), d) : void();
            }
        }

        reference_layer_kv & kv = out.kv[size_t(il)];
        kv.k.resize(size_t(n_kv) * size_t(n) * size_t(d));
        kv.v.resize(kv.k.size());
        kv.q.resize(size_t(c.n_head) * size_t(n) * size_t(d));
        for (int32_t hh = 0; hh < c.n_head; ++hh) {
            for (int32_t j = 0; j < n; ++j) {
                for (int32_t e = 0; e < d; ++e) {
                    kv.q[(size_t(hh) * size_t(n) + size_t(j)) * size_t(d) + size_t(e)] = float(q[size_t(j)][size_t(hh * d + e)]);
                }
            }
        }
        for (int32_t g = 0; g < n_kv; ++g) {
            for (int32_t j = 0; j < n; ++j) {
                for (int32_t e = 0; e < d; ++e) {
                    const size_t dst = (size_t(g) * size_t(n) + size_t(j)) * size_t(d) + size_t(e);
                    kv.k[dst]        = float(k[size_t(j)][size_t(g * d + e)]);
                    kv.v[dst]        = float(v[size_t(j)][size_t(g * d + e)]);
                }
            }
        }

        std::vector<vecd> x_next(static_cast<size_t>(n));
        for (int32_t i = 0; i < n; ++i) {
            vecd attn(size_t(c.n_head * d), 0.0);
            for (int32_t hh = 0; hh < c.n_head; ++hh) {
                const int32_t g = hh / group;  // GQA: query head -> KV head by division, as ggml does
                std::vector<double>  s;
                std::vector<int32_t> idx;
                for (int32_t j = 0; j < (blocks.empty() ? i + 1 : n); ++j) {
                    if (!in_order(i, j)) {
                        continue;
                    }
                    // llama_hparams::is_masked_swa, LLAMA_SWA_TYPE_STANDARD: p1 - p0 >= n_swa hides p0 from p1 (a
                    // later key of a non-causal block, p1 - p0 < 0, is not hidden: LLAMA_NON_CAUSAL_TYPE_ALL)
                    if (swa && positions[size_t(i)][0] - positions[size_t(j)][0] >= c.sliding_window) {
                        continue;
                    }
                    if (keep && !keep(il, g, i, j)) {
                        continue;
                    }
                    double dot = 0.0;
                    for (int32_t e = 0; e < d; ++e) {
                        dot += q[size_t(i)][size_t(hh * d + e)] * k[size_t(j)][size_t(g * d + e)];
                    }
                    s.push_back(dot * scale);
                    idx.push_back(j);
                }
                if (s.empty()) {
                    continue;
                }
                const double mx  = *std::max_element(s.begin(), s.end());
                double       sum = 0.0;
                for (double & z : s) {
                    z = std::exp(z - mx);
                    sum += z;
                }
                for (size_t t = 0; t < s.size(); ++t) {
                    const double p = s[t] / sum;
                    for (int32_t e = 0; e < d; ++e) {
                        attn[size_t(hh * d + e)] += p * v[size_t(idx[t])][size_t(g * d + e)];
                    }
                }
            }
            vecd o = linear(m, blk + "attn_output", attn, blk + "attn_output.bias");
            if (gemma3) {
                o = rms_norm(o, m.tensor(blk + "post_attention_norm.weight"), eps);
            }
            vecd r = x[size_t(i)];
            for (int32_t e = 0; e < n_embd; ++e) {
                r[size_t(e)] += o[size_t(e)];
            }

            const vecd h    = rms_norm(r, m.tensor(blk + "ffn_norm.weight"), eps);
            const vecd gate = linear(m, blk + "ffn_gate", h, blk + "ffn_gate.bias");
            const vecd up   = linear(m, blk + "ffn_up", h, blk + "ffn_up.bias");
            vecd       act(gate.size());
            for (size_t e = 0; e < act.size(); ++e) {
                act[e] = (gemma3 ? gelu_tanh(gate[e]) : silu(gate[e])) * up[e];
            }
            vecd down = linear(m, blk + "ffn_down", act, blk + "ffn_down.bias");
            if (gemma3) {
                down = rms_norm(down, m.tensor(blk + "post_ffw_norm.weight"), eps);
            }
            for (int32_t e = 0; e < n_embd; ++e) {
                r[size_t(e)] += down[size_t(e)];
            }
            if (il < int32_t(in[size_t(i)].deepstack.size())) {  // qwen3vl: after the FFN residual
                for (int32_t e = 0; e < n_embd; ++e) {
                    r[size_t(e)] += in[size_t(i)].deepstack[size_t(il)][size_t(e)];
                }
            }
            x_next[size_t(i)] = std::move(r);
        }
        x = std::move(x_next);
    }

    const vecd h      = rms_norm(x.back(), m.tensor("output_norm.weight"), eps);
    // qwen2 adds output.bias, qwen2vl creates it but never adds it (0 here either way); the others have none.
    // gemma3's final logit softcapping is off (no final_logit_softcapping key).
    const vecd logits = linear(m, "output", h);
    out.logits.assign(logits.begin(), logits.end());
    return out;
}

std::vector<float> reference_logits(const tiny_model & m, const std::vector<int32_t> & tokens,
                                    const std::vector<position> & positions, const keep_fn & keep,
                                    const kv_rounding & rounding, const input_embeddings & inputs,
                                    const std::vector<int32_t> & blocks) {
    return reference_forward(m, tokens, positions, keep, rounding, inputs, blocks).logits;
}

std::vector<reference_layer_kv> reference_kv(const tiny_model & m, const std::vector<int32_t> & tokens,
                                             const std::vector<position> & positions, const keep_fn & keep) {
    return reference_forward(m, tokens, positions, keep).kv;
}

// ---- decoding through llama.cpp ----------------------------------------------------------------------------------

int32_t decode_prompt(llama_context * ctx, const tiny_model & m, const std::vector<int32_t> & tokens,
                      const std::vector<position> & positions, int32_t seq_id, const input_embeddings & inputs) {
    if (positions.size() != tokens.size() || tokens.empty()) {
        throw std::invalid_argument("decode_prompt: need one position per token and at least one token");
    }
    const int32_t           n      = int32_t(tokens.size());
    const int32_t           n_inp  = m.n_embd_inp();
    const int32_t           planes = m.mrope() ? 4 : 1;
    const std::vector<bool> embd_tok = embedding_tokens(m, positions, inputs);
    for (const std::vector<float> & e : inputs) {  // before anything is decoded
        if (!e.empty() && int32_t(e.size()) != n_inp) {
            throw std::invalid_argument("decode_prompt: an input embedding needs n_embd_inp floats");
        }
    }

    for (int32_t i0 = 0; i0 < n;) {
        const bool text = !embd_tok[size_t(i0)];
        int32_t    i1   = i0 + 1;
        while (i1 < n && embd_tok[size_t(i1)] == embd_tok[size_t(i0)]) {
            ++i1;
        }
        const int32_t nt = i1 - i0;

        std::vector<llama_token>    tok;
        std::vector<float>          embd;
        std::vector<llama_pos>      pos(size_t(nt) * (text ? 1 : planes), 0);
        std::vector<int32_t>        n_seq(size_t(nt), 1);
        llama_seq_id                sid = seq_id;
        std::vector<llama_seq_id *> sids(size_t(nt), &sid);
        std::vector<int8_t>         out(size_t(nt), 0);
        out.back() = i1 == n ? 1 : 0;

        for (int32_t r = 0; r < nt; ++r) {
            const size_t     i = size_t(i0 + r);
            const position & p = positions[i];
            pos[size_t(r)]     = p[0];
            if (text) {
                tok.push_back(tokens[i]);
                continue;
            }
            const bool explicit_input = !inputs.empty() && !inputs[i].empty();
            const std::vector<float> e = explicit_input ? inputs[i] : m.input_embedding(tokens[i]);
            embd.insert(embd.end(), e.begin(), e.end());
            if (planes == 4) {
                pos[size_t(r + nt)]     = p[1];  // y
                pos[size_t(r + 2 * nt)] = p[2];  // x
                pos[size_t(r + 3 * nt)] = 0;     // z: unused, 0 as mtmd
            }
        }

        llama_batch batch{};
        batch.n_tokens = nt;
        batch.token    = text ? tok.data() : nullptr;
        batch.embd     = text ? nullptr : embd.data();
        batch.pos      = pos.data();
        batch.n_seq_id = n_seq.data();
        batch.seq_id   = sids.data();
        batch.logits   = out.data();
        if (const int32_t rc = llama_decode(ctx, batch); rc != 0) {
            return rc;
        }
        i0 = i1;
    }
    return 0;
}

}  // namespace ecokv::test
