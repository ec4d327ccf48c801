#include "responses.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ecokv::serve {

using json = nlohmann::json;

namespace {

json header_json(const answer_header & h, const char * chat_object) {
    return { { "id", h.id },
             { "object", h.completion ? "text_completion" : chat_object },
             { "created", h.created },
             { "model", h.model } };
}

}  // namespace

json stream_chunk(const answer_header & h, const json & delta, const json & finish) {
    json choice = { { "index", 0 }, { "finish_reason", finish } };
    if (h.completion) {
        choice["text"]     = delta.value("content", "");
        choice["logprobs"] = nullptr;
    } else {
        choice["delta"] = delta;
    }
    json out       = header_json(h, "chat.completion.chunk");
    out["choices"] = json::array({ choice });
    return out;
}

json usage_chunk(const answer_header & h, const json & usage) {
    json out       = stream_chunk(h, json::object(), nullptr);
    out["choices"] = json::array();
    out["usage"]   = usage;
    return out;
}

json answer_body(const answer_header & h, const std::string & text, const std::string & finish, const json & logprobs,
                 const json & usage) {
    json choice = { { "index", 0 } };
    if (h.completion) {
        choice["text"]     = text;
        choice["logprobs"] = nullptr;
    } else {
        choice["message"]  = { { "role", "assistant" }, { "content", text } };
        choice["logprobs"] = logprobs.is_null() ? json() : json{ { "content", logprobs } };
    }
    choice["finish_reason"] = finish;
    json out                = header_json(h, "chat.completion");
    out["choices"]          = json::array({ choice });
    out["usage"]            = usage;
    return out;
}

json usage_json(const usage_figures & u) {
    return {
        { "prompt_tokens", u.prompt_cells },
        { "completion_tokens", u.completion_tokens },
        { "total_tokens", u.prompt_cells + u.completion_tokens },
        { "prompt_tokens_details", { { "cached_tokens", u.cached_cells } } },
        { "prefilled_tokens", u.prompt_cells - u.cached_cells },
        { "kv_bytes_kept", u.kv_bytes_kept },
        { "kv_bytes_allocated", u.kv_bytes_allocated },
        { "kv_entries_held", u.kv_entries_held },
        { "kv_recompressions", u.kv_recompressions },
        { "kv_bytes_full", u.kv_bytes_full },
    };
}

json logprob_entry(const llama::session & s, const std::vector<float> & logits, llama_token chosen, int32_t n_top) {
    const float top = *std::max_element(logits.begin(), logits.end());
    double      sum = 0;
    for (const float l : logits) {
        sum += std::exp(double(l) - top);
    }
    const double log_z = double(top) + std::log(sum);
    const auto   token = [&](llama_token t) {
        const std::string piece = s.detokenize({ t });
        return json{ { "token", piece }, { "logprob", double(logits[size_t(t)]) - log_z },
                     { "bytes", std::vector<uint8_t>(piece.begin(), piece.end()) } };
    };
    std::vector<llama_token> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    const size_t n = std::min(size_t(n_top), order.size());
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(n), order.end(),
                      [&](llama_token a, llama_token b) { return logits[size_t(a)] > logits[size_t(b)]; });
    json entry            = token(chosen);
    entry["top_logprobs"] = json::array();
    for (size_t i = 0; i < n; ++i) {
        entry["top_logprobs"].push_back(token(order[i]));
    }
    return entry;
}

}  // namespace ecokv::serve
