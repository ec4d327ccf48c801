// ecokv-llama: the small amount of text generation the tools and tests need (greedy, teacher forcing, KL).
#pragma once

#include <llama.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace ecokv::llama {

// Tokens of `text`; add_special adds BOS when the vocabulary wants it; special tokens in the text are parsed.
std::vector<llama_token> tokenize(const llama_model * model, const std::string & text, bool add_special);
std::string              detokenize(const llama_model * model, const std::vector<llama_token> & tokens);

// The model's chat template applied to one user message (with the assistant prefix), or `user` unchanged
// when the model has no template.
std::string chat_prompt(const llama_model * model, const std::string & user);

struct chat_message {
    std::string role;     // system, user or assistant
    std::string content;  // text, with libmtmd media markers where images go
};

// The chat template applied to a conversation, with the assistant prefix. A model without a template gets the
// plain format the bundled tiny VLM was trained on: a system message and "\n", then per user message "\n" and its
// content (media markers each followed by "\n" come first), per assistant message its content and the EOS text.
std::string chat_text(const llama_model * model, const std::vector<chat_message> & messages);

// Decodes `tokens` into sequence 0 at positions pos0, pos0 + 1, ... in batches of the context's n_batch;
// returns the logits after the last token. Throws ecokv::error when llama_decode fails.
std::vector<float> decode(llama_context * ctx, const std::vector<llama_token> & tokens, llama_pos pos0);

struct generation {
    std::vector<llama_token>        tokens;
    std::vector<std::vector<float>> logits;   // the distribution each token was picked from (keep_logits)
    double                          seconds = 0;  // time spent decoding
};

// Greedy decoding from `first_logits` (the logits before position pos): up to n tokens, stopping after an
// end-of-generation token.
// Called after each single-token decode (e.g. to read a probe).
using step_hook = std::function<void()>;

generation greedy(llama_context * ctx, std::vector<float> first_logits, llama_pos pos, int32_t n, bool keep_logits,
                  const step_hook & after_step = {});
// The same loop with the decode of each picked token given: decode_one(token) decodes it and returns the next
// distribution (a sequence that compresses again between its decodes).
generation greedy(const llama_vocab * vocab, std::vector<float> first_logits, int32_t n, bool keep_logits,
                  const std::function<std::vector<float>(llama_token)> & decode_one);

// Teacher forcing: decodes tokens[0 .. n-2] one by one from pos and returns the logits after each.
std::vector<std::vector<float>> force(llama_context * ctx, const std::vector<llama_token> & tokens, llama_pos pos,
                                      const step_hook & after_step = {});

// Fidelity of a compressed cache to the full one, teacher-forced on the full cache's greedy tokens: at each
// step the argmax agreement and KL(full || compressed) of the next-token distributions. `first` is the compressed
// cache's distribution for the first answer token when it can differ from the full one (the question was decoded
// on the compressed cache); null when the prefill computed both, and that step is then not counted.
struct fidelity {
    double  agreement = 0;
    double  mean_kl   = 0;
    int32_t n         = 0;  // steps compared
};
fidelity compare_to_full(llama_context * compressed, const generation & full, llama_pos pos,
                         const std::vector<float> * first, const step_hook & after_step = {});

// KL(softmax(p) || softmax(q)) in nats.
double kl_divergence(const std::vector<float> & p_logits, const std::vector<float> & q_logits);

llama_token argmax(const std::vector<float> & logits);
// The argmax at temperature 0, else a token drawn from softmax(logits / temperature) with `rng`.
llama_token pick_token(const std::vector<float> & logits, double temperature, std::mt19937_64 & rng);

// The logits of the last decoded position; throws when llama.cpp computed none.
std::vector<float> last_logits(llama_context * ctx);

}  // namespace ecokv::llama
