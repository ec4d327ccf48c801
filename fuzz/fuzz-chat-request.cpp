// The server's request reading (ecokv serve, tools/serve/chat-request) from hostile bytes: the body as the server
// parses it, every check and data-URL decode of an OpenAI chat request (and of a text completion), then its
// kv_compression over the server's flags. Only a request_error (a 4xx) may leave.
#include "fuzz-input.h"

#include "chat-request.h"

#include <nlohmann/json.hpp>

int ecokv::fuzz::chat_request(const uint8_t * data, size_t size) {
    const auto body = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) {
        return 0;
    }
    static const ecokv::serve::compression_defaults server = { ecokv::compression_named("snapkv+ecokv") };
    for (const auto parse : { &ecokv::serve::parse_chat_request, &ecokv::serve::parse_completion_request }) {
        try {
            ecokv::serve::resolve_compression(parse(body, ecokv::serve::request_limits{}), server);
        } catch (const ecokv::serve::request_error & e) {
            (void) ecokv::serve::error_body(e).dump();
        }
    }
    return 0;
}

#ifndef ECOKV_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) { return ecokv::fuzz::chat_request(data, size); }
#endif
