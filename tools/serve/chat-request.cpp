#include "chat-request.h"

#include "ecokv/error.h"
#include "ecokv/llama-session.h"

#include <algorithm>
#include <array>
#include <span>

namespace ecokv::serve {

using json = nlohmann::json;

namespace {

const json & field(const json & j, const char * key, json::value_t type, const std::string & where) {
    static const json none;
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
        return none;
    }
    const bool ok = it->type() == type || (type == json::value_t::number_float && it->is_number()) ||
                    (type == json::value_t::number_integer && it->is_number_integer());
    if (!ok) {
        throw bad_request(where + key, std::string("'") + where + key + "' has the wrong type");
    }
    return *it;
}

// A message's content: a string, or parts of type text and image_url. Images become media markers, first.
void read_content(const json & content, size_t index, chat_request & r, llama::chat_message & m) {
    const std::string where = "messages[" + std::to_string(index) + "].content";
    if (content.is_string()) {
        m.content = content.get<std::string>();
        return;
    }
    if (!content.is_array()) {
        throw bad_request(where, "'" + where + "' must be a string or an array of parts");
    }
    std::string markers, text;
    for (size_t i = 0; i < content.size(); ++i) {
        const json &      part = content[i];
        const std::string at   = where + "[" + std::to_string(i) + "]";
        const json &      type = part.is_object() ? field(part, "type", json::value_t::string, at + ".") : json();
        if (type == "text") {
            const json & t = field(part, "text", json::value_t::string, at + ".");
            text += (text.empty() ? "" : "\n") + (t.is_string() ? t.get<std::string>() : "");
        } else if (type == "image_url") {
            const json & u = part.contains("image_url") ? part["image_url"] : json();
            const json & url = u.is_object() ? field(u, "url", json::value_t::string, at + ".image_url.")
                               : u.is_string() ? u : json();
            if (!url.is_string()) {
                throw bad_request(at + ".image_url", "'" + at + ".image_url' needs a url");
            }
            if (m.role != "user") {
                throw bad_request(at, "images are taken in user messages only");
            }
            r.images.push_back(decode_data_url(url.get<std::string>()));
            markers += std::string(llama::media_marker()) + "\n";
        } else {
            throw bad_request(at + ".type", "'" + at + ".type' must be text or image_url");
        }
    }
    m.content = markers + text;
}

// The request field an option error is about: kv_compression.KEY, or kv_compression for an unknown key.
std::string param_of(const option_error & e) { return e.key.empty() ? "kv_compression" : "kv_compression." + e.key; }

}  // namespace

request_error bad_request(const std::string & param, const std::string & message) {
    return request_error(400, "invalid_request_error", param, message);
}

std::vector<uint8_t> decode_data_url(const std::string & url) {
    const size_t comma = url.find(',');
    if (url.rfind("data:image/", 0) != 0 || comma == std::string::npos ||
        url.compare(comma - 7, 7, ";base64") != 0) {
        throw bad_request("image_url", "images must be data URLs (data:image/png;base64,...); remote URLs are not "
                                       "fetched");
    }
    static const std::array<int8_t, 256> table = [] {
        std::array<int8_t, 256> t{};
        t.fill(-1);
        const char * abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for (int i = 0; i < 64; ++i) {
            t[uint8_t(abc[i])] = int8_t(i);
        }
        return t;
    }();
    std::vector<uint8_t> out;
    out.reserve((url.size() - comma) * 3 / 4);
    uint32_t acc = 0;
    int      n = 0, pad = 0;
    for (size_t i = comma + 1; i < url.size(); ++i) {
        const uint8_t c = uint8_t(url[i]);
        if (c == '=') {
            ++pad;
            continue;
        }
        if (table[c] < 0 || pad > 0) {
            throw bad_request("image_url", "the image's base64 data is malformed");
        }
        acc = acc << 6 | uint32_t(table[c]);
        if (++n == 4) {
            out.insert(out.end(), { uint8_t(acc >> 16), uint8_t(acc >> 8), uint8_t(acc) });
            acc = 0;
            n   = 0;
        }
    }
    if (n == 1 || pad > 2) {
        throw bad_request("image_url", "the image's base64 data is malformed");
    }
    if (n == 2) {
        out.push_back(uint8_t(acc >> 4));
    } else if (n == 3) {
        out.insert(out.end(), { uint8_t(acc >> 10), uint8_t(acc >> 2) });
    }
    if (out.empty()) {
        throw bad_request("image_url", "the image is empty");
    }
    return out;
}

namespace {

// Fields accepted only at the value that changes nothing (OpenAI's defaults): anything else is refused, naming the
// field, rather than ignored.
struct neutral_field {
    const char * name;
    bool (*neutral)(const json &);
    const char * refusal;
};

const neutral_field k_neutral_fields[] = {
    { "top_p", [](const json & v) { return v.is_number() && v.get<double>() == 1; },
      "'top_p' other than 1 is not supported: tokens are greedy, or sampled by temperature" },
    { "presence_penalty", [](const json & v) { return v.is_number() && v.get<double>() == 0; },
      "'presence_penalty' other than 0 is not supported" },
    { "frequency_penalty", [](const json & v) { return v.is_number() && v.get<double>() == 0; },
      "'frequency_penalty' other than 0 is not supported" },
    { "logit_bias", [](const json & v) { return v.is_object() && v.empty(); }, "'logit_bias' is not supported" },
    { "response_format", [](const json & v) { return v.is_object() && v.size() == 1 && v.contains("type") && v["type"] == "text"; },
      "'response_format' other than {\"type\": \"text\"} is not supported: no JSON or grammar-constrained output" },
    { "tools", [](const json & v) { return v.is_array() && v.empty(); },
      "'tools' are not supported: this server has no function calling" },
    { "tool_choice", [](const json & v) { return v == "none"; },
      "'tool_choice' other than \"none\" is not supported: this server has no function calling" },
    { "parallel_tool_calls", [](const json & v) { return v.is_boolean(); }, "'parallel_tool_calls' must be a boolean" },
    { "cache_prompt", [](const json & v) { return v == true; },
      "'cache_prompt' is always on here: conversations are kept and continued (send true or leave it out)" },
    { "store", [](const json & v) { return v == false; }, "'store' is not supported: nothing is stored" },
    { "echo", [](const json & v) { return v == false; }, "'echo' is not supported: the prompt is not returned" },
    { "best_of", [](const json & v) { return v == 1; }, "only best_of = 1 is supported" },
};

// The fields the parsers read: every request's, then a chat's or a completion's own.
const char * const k_common_fields[] = { "model", "max_tokens", "max_completion_tokens", "temperature", "seed",
                                         "stop", "ignore_eos", "kv_kept", "stream", "stream_options", "n", "kv_compression", "user" };
const char * const k_chat_fields[]       = { "messages", "logprobs", "top_logprobs" };
const char * const k_completion_fields[] = { "prompt" };

// A field neither read nor neutral, or neutral at another value, is a 400 naming it.
void refuse_unsupported_fields(const json & body, std::span<const char * const> own) {
    const auto in = [](std::span<const char * const> names, const std::string & n) {
        return std::find(names.begin(), names.end(), n) != names.end();
    };
    for (const auto & [name, value] : body.items()) {
        if (value.is_null() || in(k_common_fields, name) || in(own, name)) {
            continue;
        }
        const std::string & key  = name;  // clang 14 cannot capture a structured binding
        const auto          rule = std::find_if(std::begin(k_neutral_fields), std::end(k_neutral_fields),
                                                [&](const neutral_field & f) { return key == f.name; });
        if (rule == std::end(k_neutral_fields)) {
            throw bad_request(name, "unknown field '" + name + "'");
        }
        if (!rule->neutral(value)) {
            throw bad_request(name, rule->refusal);
        }
    }
}

// stream_options (only with stream, as OpenAI requires) and user.
void read_output_options(const json & body, chat_request & r) {
    const json & options = field(body, "stream_options", json::value_t::object, "");
    if (!options.is_null()) {
        if (!r.stream) {
            throw bad_request("stream_options", "'stream_options' is only allowed when 'stream' is true");
        }
        const json & usage = field(options, "include_usage", json::value_t::boolean, "stream_options.");
        r.include_usage    = usage.is_boolean() && usage.get<bool>();
    }
    const json & user = field(body, "user", json::value_t::string, "");
    (void) user;  // an end user's id: type-checked, kept nowhere
}

// logprobs and top_logprobs, as the chat API has them.
void read_logprobs(const json & body, chat_request & r) {
    const json & logprobs = field(body, "logprobs", json::value_t::boolean, "");
    r.logprobs            = logprobs.is_boolean() && logprobs.get<bool>();
    const json & top      = field(body, "top_logprobs", json::value_t::number_integer, "");
    if (!top.is_null()) {
        if (!r.logprobs || top.get<int64_t>() < 0 || top.get<int64_t>() > 20) {
            throw bad_request("top_logprobs", "'top_logprobs' must lie in [0, 20], with 'logprobs' true");
        }
        r.top_logprobs = top.get<int32_t>();
    }
}

// Every request's fields: max_tokens, sampling, stop, stream and its options, n, kv_compression.
void read_common_fields(const json & body, const request_limits & limits, chat_request & r) {
    const json & max_tokens = body.contains("max_completion_tokens")
                                  ? field(body, "max_completion_tokens", json::value_t::number_integer, "")
                                  : field(body, "max_tokens", json::value_t::number_integer, "");
    r.max_tokens = limits.max_tokens_default;
    if (!max_tokens.is_null()) {
        if (max_tokens.get<int64_t>() < 1 || max_tokens.get<int64_t>() > limits.max_tokens_limit) {
            throw bad_request("max_tokens", "'max_tokens' must lie in [1, " + std::to_string(limits.max_tokens_limit) + "]");
        }
        r.max_tokens = max_tokens.get<int32_t>();
    }
    const json & temperature = field(body, "temperature", json::value_t::number_float, "");
    if (!temperature.is_null()) {
        r.temperature = temperature.get<double>();
        if (!(r.temperature >= 0 && r.temperature <= 2)) {
            throw bad_request("temperature", "'temperature' must lie in [0, 2]");
        }
    }
    const json & seed = field(body, "seed", json::value_t::number_integer, "");
    if (!seed.is_null()) {
        r.seed     = seed.get<uint64_t>();
        r.has_seed = true;
    }
    const json & ignore_eos = field(body, "ignore_eos", json::value_t::boolean, "");
    r.ignore_eos            = ignore_eos.is_boolean() && ignore_eos.get<bool>();
    const json & kv_kept    = field(body, "kv_kept", json::value_t::boolean, "");
    r.kv_kept               = kv_kept.is_boolean() && kv_kept.get<bool>();
    if (body.contains("stop") && !body["stop"].is_null()) {
        const json & stop = body["stop"];
        if (stop.is_string() && !stop.get<std::string>().empty()) {
            r.stop.push_back(stop.get<std::string>());
        } else if (stop.is_array() && stop.size() <= 4) {
            for (const json & s : stop) {
                if (!s.is_string() || s.get<std::string>().empty()) {
                    throw bad_request("stop", "'stop' must hold non-empty strings");
                }
                r.stop.push_back(s.get<std::string>());
            }
        } else {
            throw bad_request("stop", "'stop' must be a string or an array of up to 4 strings");
        }
    }
    const json & stream = field(body, "stream", json::value_t::boolean, "");
    r.stream            = stream.is_boolean() && stream.get<bool>();
    read_output_options(body, r);
    if (body.contains("n") && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1)) {
        throw bad_request("n", "only n = 1 is supported");
    }
    if (body.contains("kv_compression") && !body["kv_compression"].is_null()) {
        const json & kv = body["kv_compression"];
        if (kv.is_boolean()) {
            r.kv_compression_off = !kv.get<bool>();
        } else if (kv.is_object()) {
            r.kv_compression = kv;
        } else {
            throw bad_request("kv_compression", "'kv_compression' must be false or an object of method options");
        }
    }
}

// What both endpoints start with: a JSON object, and its optional model name.
chat_request request_of(const json & body) {
    if (!body.is_object()) {
        throw bad_request("", "the request body must be a JSON object");
    }
    chat_request r;
    const json & model = field(body, "model", json::value_t::string, "");
    r.model            = model.is_string() ? model.get<std::string>() : "";
    return r;
}

}  // namespace

chat_request parse_chat_request(const json & body, const request_limits & limits) {
    chat_request r    = request_of(body);
    const json & msgs = field(body, "messages", json::value_t::array, "");
    if (!msgs.is_array() || msgs.empty()) {
        throw bad_request("messages", "'messages' must be a non-empty array");
    }
    for (size_t i = 0; i < msgs.size(); ++i) {
        const std::string at = "messages[" + std::to_string(i) + "]";
        if (!msgs[i].is_object()) {
            throw bad_request(at, "'" + at + "' must be an object");
        }
        const json & role = field(msgs[i], "role", json::value_t::string, at + ".");
        if (role != "system" && role != "user" && role != "assistant") {
            throw bad_request(at + ".role", "'" + at + ".role' must be system, user or assistant");
        }
        llama::chat_message m{ role.get<std::string>(), "" };
        const json & content = msgs[i].contains("content") ? msgs[i]["content"] : json();
        if (content.is_null()) {
            throw bad_request(at + ".content", "'" + at + ".content' is missing");
        }
        read_content(content, i, r, m);
        r.messages.push_back(std::move(m));
    }
    if (r.messages.back().role != "user") {
        throw bad_request("messages", "the last message must be the user's");
    }
    if (r.images.size() > limits.max_images) {
        throw bad_request("messages", "at most " + std::to_string(limits.max_images) + " images per request");
    }
    read_common_fields(body, limits, r);
    read_logprobs(body, r);
    refuse_unsupported_fields(body, k_chat_fields);
    return r;
}

chat_request parse_completion_request(const json & body, const request_limits & limits) {
    chat_request r      = request_of(body);
    const json & prompt = body.contains("prompt") ? body["prompt"] : json();
    if (prompt.is_string() && !prompt.get<std::string>().empty()) {
        r.prompt_text = prompt.get<std::string>();
    } else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string() && !prompt[0].get<std::string>().empty()) {
        r.prompt_text = prompt[0].get<std::string>();
    } else {
        throw bad_request("prompt", "'prompt' must be a non-empty string (or an array of one)");
    }
    read_common_fields(body, limits, r);
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
        throw bad_request("logprobs", "'logprobs' is not supported on /v1/completions (it is on /v1/chat/completions)");
    }
    refuse_unsupported_fields(body, k_completion_fields);
    return r;
}

json error_body(const request_error & e) {
    // A message quotes what the client sent; bytes that are not UTF-8 become U+FFFD (nlohmann's own replacement),
    // so that the body can always be written.
    const json message = json::parse(json(e.what()).dump(-1, ' ', false, json::error_handler_t::replace));
    return { { "error", { { "message", message },
                          { "type", e.type },
                          { "param", e.param.empty() ? json(nullptr) : json(e.param) },
                          { "code", nullptr } } } };
}

compression resolve_compression(const chat_request & r, const compression_defaults & o) {
    if (r.kv_compression_off || (!o.compress && !r.kv_compression)) {
        return compression::none();
    }
    compression  c = o.server;
    const json   none = json::object();
    const json & kv   = r.kv_compression ? *r.kv_compression : none;
    for (const auto & [k, v] : kv.items()) {
        try {
            const option_info & row = find_option(k);
            if (!row.client) {
                throw bad_request("kv_compression." + k, "'kv_compression." + k + "' is a server option (--" +
                                                             row.flag() + ")");
            }
            if (v.is_string()) {
                set_option(c, k, v.get<std::string>());
            } else if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
                set_option(c, k, v.get<int64_t>());
            } else if (v.is_number()) {
                set_option(c, k, v.get<double>());
            } else {
                throw bad_request("kv_compression." + k, "'kv_compression." + k + "' must be a string or a number");
            }
        } catch (const option_error & e) {
            throw bad_request(param_of(e), std::string("kv_compression: ") + e.what());
        }
    }
    try {
        c.validate();
    } catch (const option_error & e) {  // the client may not know the server chunks by default
        const bool inherited = e.key == "chunk" && !kv.contains("chunk");
        throw bad_request(param_of(e),
                          std::string("kv_compression: ") + e.what() +
                              (inherited ? " (the server's --chunk; send \"chunk\": 0 for a one-shot compression)" : ""));
    }
    if (requirements(c.spec, c.params).head_scores && c.params.head_scores.empty()) {
        throw bad_request("kv_compression.method", c.spec.name() + " needs head scores: start the server with "
                                                                    "--head-scores");
    }
    return c;
}

}  // namespace ecokv::serve
