// ecokv serve: an OpenAI chat-completions request, checked, and the pieces of its answer.
#pragma once

#include "ecokv/llama-generate.h"
#include "ecokv/method.h"

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
    std::vector<llama::chat_message>  messages;  // content with one media marker per image
    std::vector<std::vector<uint8_t>> images;    // decoded image_url data, in prompt order
    int32_t                           max_tokens  = 0;
    double                            temperature = 0;  // 0: greedy
    uint64_t                          seed        = 0;
    bool                              has_seed    = false;
    std::vector<std::string>          stop;
    bool                              stream = false;
    // "kv_compression": absent (server default), false (full cache), or an object of method options.
    std::optional<nlohmann::json>     kv_compression;
    bool                              kv_compression_off = false;
};

struct request_limits {
    int32_t max_tokens_default = 128;
    int32_t max_tokens_limit   = 4096;
    size_t  max_images         = 16;
};

// The KV compression of one request (the server's method flags with the request's kv_compression on top).
struct compression {
    bool          on = false;
    method_spec   spec;
    method_params params;
    int32_t       chunk = 0;  // chunked prefill of the context, cells per chunk (0: one shot)
    std::string   key;  // identity: conversations kept under another compression are not continued
};

// The server's side of a request's compression.
struct compression_defaults {
    std::vector<std::string> method_args;   // the server's method flags (--method X --budget N ...)
    bool                     compress = true;  // false: full caches unless a request asks
    std::string              head_scores;   // SparseMM head scores (server side only)
    int32_t                  chunk = 0;     // the server's --chunk (a request's kv_compression.chunk overrides it)
};

// The server's flags, then the request's kv_compression fields on top, validated as `ecokv run` validates its
// flags; throws request_error naming the field at fault.
compression resolve_compression(const chat_request & r, const compression_defaults & d);

// Checks and reads a request body (already parsed JSON); throws request_error naming the field at fault.
chat_request parse_chat_request(const nlohmann::json & body, const request_limits & limits);

// Bytes of a "data:image/...;base64,..." URL; throws request_error for anything else.
std::vector<uint8_t> decode_data_url(const std::string & url);

// {"error": {"message", "type", "param", "code"}} as OpenAI sends it.
nlohmann::json error_body(const request_error & e);

}  // namespace ecokv::serve
