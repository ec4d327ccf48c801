// ecokv serve: an OpenAI chat-completions request, checked, and the pieces of its answer.
#pragma once

#include "ecokv/llama-generate.h"
#include "ecokv/options.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ecokv::serve {

// A request the server refuses: HTTP status, OpenAI error type, the parameter at fault (or empty), a message.
struct request_error : std::runtime_error {
    int         status;
    std::string type, param;
    request_error(int status, std::string type, std::string param, const std::string & message) :
        std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)) {}
};

request_error bad_request(const std::string & param, const std::string & message);

struct chat_request {
    std::string                       model;
    std::optional<std::string>        prompt_text;  // a completion (/v1/completions): the raw prompt, no chat template
    std::vector<llama::chat_message>  messages;  // content with one media marker per image
    std::vector<std::vector<uint8_t>> images;    // decoded image_url data, in prompt order
    int32_t                           max_tokens  = 0;
    double                            temperature = 0;  // 0: greedy
    uint64_t                          seed        = 0;
    bool                              has_seed    = false;
    std::vector<std::string>          stop;
    bool                              ignore_eos = false;  // llama-server's: end-of-generation tokens never picked
    bool                              kv_kept    = false;  // ecokv's: the answer says what each KV head holds
    bool                              stream = false;
    bool                              include_usage = false;  // stream_options.include_usage: a usage chunk last
    bool                              logprobs      = false;  // the chosen tokens' log-probabilities
    int32_t                           top_logprobs  = 0;      // and this many most likely tokens at each step
    // "kv_compression": absent (server default), false (full cache), or an object of method options.
    std::optional<nlohmann::json>     kv_compression;
    bool                              kv_compression_off = false;
};

struct request_limits {
    int32_t max_tokens_default = 128;
    int32_t max_tokens_limit   = 4096;
    size_t  max_images         = 16;
};

// The server's side of a request's compression.
struct compression_defaults {
    compression server;           // the server's method flags and --chunk: a request without kv_compression gets it
    bool        compress = true;  // false: full caches unless a request asks
};

// The server's compression with the request's kv_compression fields set on it by the option table's setters, then
// validated; throws request_error naming the field at fault (kv_compression.budget), or kv_compression for an
// unknown field. Options on the server's files (head_scores) are not the client's.
compression resolve_compression(const chat_request & r, const compression_defaults & d);

// Checks and reads a request body (already parsed JSON); throws request_error naming the field at fault, also for
// any field neither honoured nor at a neutral value (docs/serve.md lists them).
chat_request parse_chat_request(const nlohmann::json & body, const request_limits & limits);
// The same for /v1/completions: `prompt` (a string) in place of messages, no logprobs.
chat_request parse_completion_request(const nlohmann::json & body, const request_limits & limits);

// Bytes of a "data:image/...;base64,..." URL; throws request_error for anything else.
std::vector<uint8_t> decode_data_url(const std::string & url);

// {"error": {"message", "type", "param", "code"}} as OpenAI sends it.
nlohmann::json error_body(const request_error & e);

}  // namespace ecokv::serve
