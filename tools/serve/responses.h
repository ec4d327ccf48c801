// ecokv serve: the shapes of its answers, as OpenAI's API spells them (chat completions, completions, stream chunks,
// usage, log-probabilities), so that the server's handlers only fill them in.
#pragma once

#include "ecokv/llama-session.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace ecokv::serve {

// What identifies one answer in every body and chunk: id, object kind, creation time, model.
struct answer_header {
    std::string id, model;
    int64_t     created    = 0;
    bool        completion = false;  // /v1/completions (text_completion) rather than chat
};

// A stream chunk with one choice: `delta` ({"content": ...} or {"role": ...}) and the finish reason (null while going
// on). A completion's choice carries the delta's content as its text.
nlohmann::json stream_chunk(const answer_header & h, const nlohmann::json & delta, const nlohmann::json & finish);
// The last chunk of a stream with stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk(const answer_header & h, const nlohmann::json & usage);
// The whole answer: chat.completion (with the logprobs' content when asked: `logprobs` not null) or text_completion.
nlohmann::json answer_body(const answer_header & h, const std::string & text, const std::string & finish,
                           const nlohmann::json & logprobs, const nlohmann::json & usage);

// What one answer cost and held: OpenAI's usage with the prompt's cached cells, and ecokv's KV figures.
struct usage_figures {
    int32_t  prompt_cells = 0, cached_cells = 0, completion_tokens = 0;
    uint64_t kv_bytes_kept = 0, kv_bytes_allocated = 0, kv_bytes_full = 0;
    int32_t  kv_entries_held = 0, kv_recompressions = 0;
};
nlohmann::json usage_json(const usage_figures & u);

// OpenAI's logprobs entry of the token chosen at one step, with the n most likely tokens, from the step's logits.
nlohmann::json logprob_entry(const llama::session & s, const std::vector<float> & logits, llama_token chosen,
                             int32_t n_top);

}  // namespace ecokv::serve
