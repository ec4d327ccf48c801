// Test support: tiny random-weight llama.cpp models built in memory, and an independent reference forward pass.
//
// make_tiny_model() builds a `llama`, `qwen2`, `qwen2vl`, `qwen3vl` or `gemma3` model through llama_model_init_from_user()
// with the dummy "test" tokenizer (token ids are fed directly) and keeps a copy of every weight as F32.
// reference_forward() recomputes the model in double precision with plain loops (no ggml), with an optional
// per-(layer, KV head, query, key) mask and optional per-token input embeddings (image embeddings, deepstack parts),
// so tests can check what llama.cpp computes with a full or an evicted KV cache. See tests/llama/README.md.
//
// The same builder makes bench-decode's billion-parameter models: quantized matrices (weight_type) and no F32 copy
// (keep_reference_weights = false), filled chunk by chunk on n_threads threads with the same values.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

struct llama_model;
struct llama_context;

namespace ecokv::test {

struct tiny_config {
    // "llama" (stories260K-like), "qwen2" (Q/K/V biases, NEOX RoPE: InternVL3's text model), "qwen2vl" (M-RoPE, Q/K/V
    // biases), "qwen3vl" (Qwen3-VL's text model: Q/K RMS norms, interleaved M-RoPE, deepstack inputs) or "gemma3"
    // (Gemma 3's text model: sqrt(n_embd)-scaled token embeddings, Q/K norms, post-attention/post-FFN norms, GELU FFN,
    // interleaved sliding-window attention with its own RoPE base).
    std::string arch = "llama";
    int32_t n_layer = 2, n_embd = 64, n_head = 4, n_head_kv = 2, n_ff = 128, n_vocab = 128, n_ctx_train = 4096;
    float    rope_freq_base = 10000;
    uint64_t seed = 1;
    // "test": llama.cpp's dummy tokenizer (token ids are fed directly; no piece text). "bpe": a byte-level BPE
    // vocabulary (every byte a token, then "\n\n", <|im_start|> (BOS), <|im_end|> (EOS), <fake_token_around_image>,
    // <global-img>, <end_of_utterance>; needs n_vocab >= 262), for projectors whose mtmd layout looks pieces up by text.
    std::string tokenizer = "test";
    // tokenizer.chat_template, or none when empty: llama.cpp picks its built-in template from the text (chatml for
    // "<|im_start|>", gemma for "<start_of_turn>", ...), which ecokv's chat prompts and question split then use.
    std::string chat_template;
    // qwen2vl and qwen3vl: M-RoPE sections (t, y, x, extra) counted in rotation pairs; the extra section must be 0 and
    // the sum in (0, head_dim]. qwen2vl gives contiguous runs of pairs to t, y, x (sum = head_dim/2 covers every pair).
    // qwen3vl interleaves them (IMROPE): pair i, sector s = i % sum, takes y if s%3 == 1 && s < 3*sections[1], x if
    // s%3 == 2 && s < 3*sections[2], t if s%3 == 0 && s < 3*sections[0], else plane 3, which llama.cpp always sets to 0
    // (such a pair is not rotated; {2,3,3,0} leaves pair 6 of 8 there, as Qwen3-VL's {24,20,20,0} leaves 2 of 64).
    std::array<int32_t, 4> rope_sections = { 2, 3, 3, 0 };
    // qwen3vl only: deepstack layers (llama.cpp n_deepstack_layers), 0 .. n_layer-1. The model's input embedding is then
    // n_embd_inp = n_embd * (1 + n_deepstack_layers) floats: the layer input, then one part per deepstack layer; layer
    // il < n_deepstack_layers adds part il+1 to its output. Token inputs have zero parts. (A deepstack last layer
    // would make llama.cpp abort when only some tokens output logits: its output rows are selected before the add.)
    int32_t n_deepstack_layers = 0;
    // gemma3 only: sliding window in positions (llama.cpp n_swa; 0 = none: one plain KV cache and rope_freq_base for
    // every layer). With a window, layer il is a sliding-window (SWA) layer iff il % swa_pattern < swa_pattern - 1
    // (llama.cpp's set_swa_pattern; swa_pattern >= 2, so pattern 2 makes even layers SWA and odd ones global): a key
    // at position p_k is hidden from a query at p_q when p_q - p_k >= sliding_window, and RoPE uses
    // rope_freq_base_swa there, rope_freq_base in the global layers.
    int32_t sliding_window     = 8;
    int32_t swa_pattern        = 2;
    float   rope_freq_base_swa = 10000;

    // Type of the matrices (token_embd, output, attn_q/k/v/output, ffn_gate/up/down): "f32", "f16", "q8_0" or
    // "q4_0". A matrix whose rows are not whole quantization blocks stays F32; norms, biases and scales are F32.
    std::string weight_type = "f32";
    // Keep an F32 copy of every weight (as stored: F16-rounded or dequantized), which tensors(), embedding(),
    // reference_forward() and decode_prompt()'s image rows read. Off for models too large to copy twice.
    bool keep_reference_weights = true;
    // Threads filling the tensors (the values do not depend on it).
    int32_t n_threads = 1;
    // Called after each tensor with the bytes of weights filled so far and in all; must not throw.
    std::function<void(uint64_t done, uint64_t total)> on_progress;

    // Layers offloaded to the GPU devices (llama_model_params::n_gpu_layers; -1 all). The default is the environment's
    // ECOKV_TEST_NGL, else 0: a GPU build runs the same tests on its device (scripts/test-gpu.sh).
    int32_t n_gpu_layers = test_gpu_layers();

    static int32_t test_gpu_layers();

    int32_t head_dim() const { return n_embd / n_head; }
};

// One weight as llama.cpp created it: ne in ggml order (ne[0] fastest), data row-major over that order, i.e. a
// matrix {n_in, n_out} holds W[o][i] at data[o*n_in + i].
struct tiny_tensor {
    std::array<int64_t, 4> ne = { 1, 1, 1, 1 };
    std::vector<float>     data;
};

class tiny_model {
  public:
    tiny_model(tiny_model && other) noexcept;
    tiny_model & operator=(tiny_model && other) noexcept;
    tiny_model(const tiny_model &)             = delete;
    tiny_model & operator=(const tiny_model &) = delete;
    ~tiny_model();  // llama_model_free

    llama_model *       get() const { return model_; }
    // Hands the llama_model over to the caller (who frees it with llama_model_free); get() is null afterwards.
    llama_model *       release();
    const tiny_config & config() const { return config_; }
    int64_t             n_params() const { return n_params_; }  // elements of every tensor llama.cpp filled
    uint64_t            n_bytes() const { return n_bytes_; }    // their size as stored (quantized matrices)
    // Positions have (t, y, x) planes (M-RoPE: qwen2vl, qwen3vl); llama.cpp takes 4 position planes per embedding.
    bool                mrope() const { return config_.arch == "qwen2vl" || config_.arch == "qwen3vl"; }
    // RMSNorm epsilon llama.cpp actually uses: 1e-5 (as written) for every arch but qwen2vl, which uses 0 because this
    // tree's llama_model_qwen2vl::load_arch_hparams never reads layer_norm_rms_epsilon (hparams stay zero-initialised).
    double rms_eps() const { return rms_eps_; }
    // Floats per input embedding (llama_model_n_embd_inp): n_embd * (1 + n_deepstack_layers) for qwen3vl, else n_embd.
    int32_t n_embd_inp() const;
    // gemma3 with a sliding window: whether layer il is a sliding-window layer, and the window (0 without one).
    bool    is_swa(int32_t il) const;
    int32_t n_swa() const;

    // Every tensor llama.cpp created, by GGUF name (e.g. "blk.0.attn_q.weight"), including the optional ones that a
    // from-user model creates anyway (*.scale, *.input_scale, rope_freqs, output.bias, ...), which hold 1 or 0.
    // Empty without keep_reference_weights (then tensor() and embedding() throw std::out_of_range).
    const std::map<std::string, tiny_tensor> & tensors() const { return tensors_; }
    const tiny_tensor *                        find(const std::string & name) const;    // nullptr if absent
    const tiny_tensor &                        tensor(const std::string & name) const;  // throws if absent
    const float * embedding(int32_t token) const;  // row of token_embd.weight (n_embd floats)
    // What decode_prompt sends for an image-like token without an explicit input (n_embd_inp() floats): the token's
    // row of token_embd, then for qwen3vl deepstack part k (0-based) = 0.5 * the row of token (token + 17*(k+1)) %
    // n_vocab. Deterministic, so reference_forward uses the same parts.
    std::vector<float> input_embedding(int32_t token) const;

  private:
    friend tiny_model make_tiny_model(const tiny_config & cfg);
    tiny_model() = default;

    llama_model *                      model_ = nullptr;
    tiny_config                        config_;
    double                             rms_eps_ = 1e-5;
    int64_t                            n_params_ = 0;
    uint64_t                           n_bytes_  = 0;
    std::map<std::string, tiny_tensor> tensors_;
};

// Builds the model (model params are llama_model_default_params() with cfg.n_gpu_layers). Weights are
// deterministic in (cfg, name) and independent of the platform's <random>:
//   token_embd N(0, 1); attn_q/attn_k N(0, 1.3/sqrt(n_embd)) so attention is peaked (score std ~1.7) and RoPE or
//   masking errors show in the logits; other matrices N(0, 1/sqrt(fan_in)); norms 1 + N(0, 0.1) (also
//   attn_q_norm / attn_k_norm, gemma3's post_attention_norm / post_ffw_norm, used as stored: Gemma's "1 + w" is the
//   converter's job); qwen2 / qwen2vl Q/K/V biases N(0, 0.2); every other bias 0 (qwen3vl and gemma3 have none in
//   the real models, but llama.cpp creates and adds them); every *.scale / *.input_scale / rope_freqs 1;
//   qwen3vl's unused rerank head cls.output.weight 0.
// Element i of a tensor is the (i+1)-th splitmix64::normal() of the stream seeded seed ^ fnv1a(name), rounded to the
// tensor's type; weight_type, keep_reference_weights and n_threads change how it is stored, never the value drawn.
// Throws std::invalid_argument on a bad config and std::runtime_error when llama.cpp fails or creates a tensor this
// code does not know how to neutralise.
tiny_model make_tiny_model(const tiny_config & cfg);

// Recommended bound for max |llama.cpp logit - reference logit| / max |reference logit| with the default F16 K/V
// cache. llama.cpp rounds K and V to F16 (and CPU flash attention rounds Q to F16 too): <= 2^-11 = 4.9e-4 relative
// per element, the rest is F32 against our double. Measured on 2-3 layer models: 4e-4 .. 8e-4 typical, 1.0e-3 worst
// over 40 seeds x {llama, qwen2vl} x {FA auto, FA off}; 8.1e-4 worst over 40 seeds x {qwen3vl with an image block and
// deepstack, gemma3 past its window} x {FA auto, FA off} (2-4 layers; gemma3 1e-4 .. 3e-4: its large scaled
// embeddings dominate the residual stream). Wrong positions or one hidden key move logits by >= 2e-2.
inline constexpr double logit_rel_tolerance = 3e-3;

// n token ids below n_vocab from a fixed LCG (the tests' prompts; no <random>).
inline std::vector<int32_t> prompt_tokens(int32_t n, int32_t n_vocab, uint32_t seed) {
    std::vector<int32_t> t;
    for (int32_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        t.push_back(int32_t((seed >> 8) % uint32_t(n_vocab)));
    }
    return t;
}

// max |a - b| / max |b|, the measure logit_rel_tolerance bounds.
inline double rel_diff(const std::vector<float> & a, const std::vector<float> & b) {
    double d = 0, m = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        d = std::max(d, std::fabs(double(a[i]) - b[i]));
        m = std::max(m, std::fabs(double(b[i])));
    }
    return d / m;
}

// (t, y, x) per token. For text all three equal the sequence position; llama only uses t.
using position = std::array<int32_t, 3>;

std::vector<position> text_positions(int32_t n, int32_t t0 = 0);
// An nx-by-ny image block at temporal position t, raster order, as mtmd_image_tokens_get_decoder_pos (M-RoPE):
// token i = (t, t + i/nx, t + i%nx). The next text position after it is t + max(nx, ny).
std::vector<position> image_positions(int32_t t, int32_t nx, int32_t ny);

// keep(layer, kv_head, query_index, key_index) (token indices into the prompt, key <= query, or in the query's
// non-causal block): false hides the key from every query head of that KV group in that layer. An empty function
// keeps everything.
using keep_fn = std::function<bool(int32_t layer, int32_t kv_head, int32_t query_index, int32_t key_index)>;

// K (after RoPE) and V of one layer, [n_head_kv][n_tokens][head_dim], the order of ecokv::llama::state_blob views.
struct reference_layer_kv {
    std::vector<float> k, v;  // [n_head_kv][n_tokens][head_dim], K after RoPE
    std::vector<float> q;     // [n_head][n_tokens][head_dim], after RoPE
};

// How the engine stores and reads what attention uses, applied to each head's row after RoPE: K and V as the KV
// cache holds them, Q as the attention converts it for its dot product with K. Empty functions leave a row as is.
struct kv_rounding {
    std::function<void(double * row, int32_t n)> q, k, v;
};

// llama.cpp's CPU rounding for K and V caches of these ggml types (F16, BF16, quantized; F32 is exact): a row goes
// through the type's from_float and ggml's to_float; Q through K's vec_dot_type, which CPU flash attention and
// mul_mat convert it to (F16 for an F16 K, q8_0 for q8_0 and q4_0, q8_1 for q4_1).
kv_rounding cache_rounding(int32_t k_type, int32_t v_type);

struct reference_output {
    std::vector<float>              logits;  // [n_vocab], last token
    std::vector<reference_layer_kv> kv;      // [n_layer]
};

// Explicit input embeddings, one entry per token of a prompt: n_embd_inp() floats (for qwen3vl the layer input, then
// the deepstack parts), or empty for the default. A token with an entry goes to llama.cpp as an embedding row (as mtmd
// sends image embeddings); the default for an image-like M-RoPE token is tiny_model::input_embedding(token), and for
// any other token its token id. An empty vector means every entry empty.
using input_embeddings = std::vector<std::vector<float>>;

// Which tokens decode_prompt feeds as embedding rows (ext.tok = -1 in an M-RoPE cache): those with an explicit input,
// and for M-RoPE the image-like ones (y or x differs from t, or a neighbour shares its t; a 1x1 block counts as text).
std::vector<bool> embedding_tokens(const tiny_model & m, const std::vector<position> & positions,
                                   const input_embeddings & inputs = {});

// The reference: causal attention in token-index order (key j visible to query i iff j <= i, or both are in one
// non-causal block, and keep(...)), which is llama.cpp's position mask for prompts with non-decreasing t whose image blocks are in raster order; gemma3's SWA
// layers also hide keys with t_i - t_j >= sliding_window (llama_hparams::is_masked_swa, LLAMA_SWA_TYPE_STANDARD). A
// query row with every key hidden outputs 0 for that head. RoPE as llama.cpp: llama = LLAMA_ROPE_TYPE_NORM (pairs
// (2i, 2i+1)); the others NEOX pairs (i, i + d/2): qwen2 and gemma3 with 1-D positions (gemma3: base per layer),
// qwen2vl = M-RoPE (pair i takes plane t, y or x by (i mod sum(sections)) against contiguous sections), qwen3vl =
// IMROPE (interleaved, see tiny_config::rope_sections). qwen3vl and gemma3 RMS-normalise each Q and K head (weights
// attn_q_norm / attn_k_norm) before RoPE. Attention scale 1/sqrt(head_dim) (gemma3 multiplies Q by it, the same).
// Inputs: a token's embedding row (gemma3: times sqrt(n_embd)), or for embedding_tokens() the explicit `inputs`
// entry or input_embedding(token), unscaled (llama.cpp scales gemma3's token inputs only). gemma3's FFN is
// GELU(tanh)-gated in double, where ggml's CPU op goes through an F16 table (about 1e-4 of the logits).
// Double precision throughout; weights are the F32 values in the model (keep_reference_weights; std::out_of_range
// without them). `rounding` (cache_rounding) makes the reference read what a quantized cache holds; K and V in `kv`
// are rounded too.
// `blocks`: empty (every token causal), or one id per token: the tokens with the same id >= 0 form a non-causal block
// and see each other whatever their order, as llama.cpp decodes a batch with llama_set_causal_attn(false) (mtmd does
// so for the images of projectors where mtmd_decode_use_non_causal, Gemma 3's: the batch is the image's tokens alone).
// Gemma 3's SWA layers still hide keys t_i - t_j >= sliding_window (LLAMA_NON_CAUSAL_TYPE_ALL); a later key of the
// block is never hidden by it. -1: a causal token.
reference_output reference_forward(const tiny_model & m, const std::vector<int32_t> & tokens,
                                   const std::vector<position> & positions, const keep_fn & keep = {},
                                   const kv_rounding & rounding = {}, const input_embeddings & inputs = {},
                                   const std::vector<int32_t> & blocks = {});

std::vector<float> reference_logits(const tiny_model & m, const std::vector<int32_t> & tokens,
                                    const std::vector<position> & positions, const keep_fn & keep = {},
                                    const kv_rounding & rounding = {}, const input_embeddings & inputs = {},
                                    const std::vector<int32_t> & blocks = {});

std::vector<reference_layer_kv> reference_kv(const tiny_model & m, const std::vector<int32_t> & tokens,
                                             const std::vector<position> & positions, const keep_fn & keep = {});

// Decodes a prompt into seq_id of ctx the way mtmd does: text runs go as token batches (llama.cpp broadcasts t to
// every position plane; plane 3 gets 0); embedding_tokens() runs go as embedding batches of n_embd_inp() floats per
// token (the `inputs` entry, else input_embedding(token); ext.tok = -1 in the cache), with 4 position planes
// [t | y | x | 0] for M-RoPE and 1 otherwise. Can be called again to append. Every run must fit in the context's
// n_batch/n_ubatch as llama_decode allows. Only the last token's logits are requested: read them with
// llama_get_logits_ith(ctx, -1). Returns the first non-zero llama_decode result, or 0.
int32_t decode_prompt(llama_context * ctx, const tiny_model & m, const std::vector<int32_t> & tokens,
                      const std::vector<position> & positions, int32_t seq_id = 0,
                      const input_embeddings & inputs = {});

}  // namespace ecokv::test
