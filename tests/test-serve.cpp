// ecokv serve's request reading and conversation cache, against values worked out by hand. The server itself is
// tested end to end with real clients by tests/server/test-serve.sh.
#include "chat-request.h"
#include "conversation-cache.h"
#include "redis-store.h"
#include "scheduler.h"

#include "ecokv/llama-session.h"

#include <gtest/gtest.h>

namespace {

using namespace ecokv::serve;
using json = nlohmann::json;
using ecokv::compression;

std::string param_of(const std::function<void()> & f) {
    try {
        f();
    } catch (const request_error & e) {
        EXPECT_EQ(e.status, 400);
        return e.param;
    }
    ADD_FAILURE() << "no request_error";
    return "";
}

std::vector<uint8_t> bytes(const std::string & s) { return std::vector<uint8_t>(s.begin(), s.end()); }

TEST(serve, data_urls_decode_base64) {
    EXPECT_EQ(decode_data_url("data:image/png;base64,aGVsbG8="), bytes("hello"));  // RFC 4648 test vectors
    EXPECT_EQ(decode_data_url("data:image/png;base64,Zm9vYmFy"), bytes("foobar"));
    EXPECT_EQ(decode_data_url("data:image/jpeg;base64,Zm8="), bytes("fo"));
    EXPECT_EQ(decode_data_url("data:image/png;base64,Zg=="), bytes("f"));
    for (const char * bad : { "http://example.com/a.png", "data:text/plain;base64,Zm8=", "data:image/png,Zm8=",
                              "data:image/png;base64,Zm8*", "data:image/png;base64,Z=m8", "data:image/png;base64,Zm9vY",
                              "data:image/png;base64," }) {
        EXPECT_EQ(param_of([&] { decode_data_url(bad); }), "image_url") << bad;
    }
}

// kv_compression over the server's flags: the request's fields win, bad ones are a 400 naming the field
// (kv_compression.budget), an unknown one kv_compression (a 20 KiB option name once overflowed the stack in
// cxxopts' std::regex, found by fuzz-chat-request).
TEST(serve, kv_compression_is_resolved_over_the_server_flags) {
    const compression_defaults server = { ecokv::compression_named("snapkv+ecokv") };
    auto request = [](json kv) {
        return parse_chat_request({ { "messages", { { { "role", "user" }, { "content", "x" } } } }, { "kv_compression", kv } },
                                  request_limits{});
    };
    const compression c = resolve_compression(request({ { "budget", 40 }, { "method", "pyramidkv" } }), server);
    EXPECT_TRUE(c.enabled);
    EXPECT_EQ(c.spec.name(), "pyramidkv+snapkv");
    EXPECT_EQ(c.params.budget, 40);
    EXPECT_FALSE(resolve_compression(request(false), server).enabled);
    EXPECT_EQ(param_of([&] { resolve_compression(request({ { std::string(20000, 'f'), 1 } }), server); }), "kv_compression");
    EXPECT_EQ(param_of([&] { resolve_compression(request({ { "method", std::string(300, 'a') } }), server); }),
              "kv_compression.method");
    EXPECT_EQ(param_of([&] { resolve_compression(request({ { "budget", 2 } }), server); }), "kv_compression.budget");
    EXPECT_EQ(param_of([&] { resolve_compression(request({ { "head_scores", "x.json" } }), server); }),
              "kv_compression.head_scores");
}

// The chunk of a chunked prefill: the server's --chunk, a request's kv_compression.chunk over it, part of the
// conversation's identity; a chunk not larger than the window (SnapKV's 32) is a 400.
TEST(serve, kv_compression_chunk_is_resolved_over_the_server_flag) {
    compression_defaults server = { ecokv::compression_named("snapkv") };
    server.server.chunk         = 128;
    auto request = [](json kv) {
        return parse_chat_request({ { "messages", { { { "role", "user" }, { "content", "x" } } } }, { "kv_compression", kv } },
                                  request_limits{});
    };
    EXPECT_EQ(resolve_compression(request(json::object()), server).chunk, 128);
    const compression one_shot = resolve_compression(request({ { "chunk", 0 } }), server);
    const compression chunked  = resolve_compression(request({ { "chunk", 96 } }), server);
    EXPECT_EQ(one_shot.chunk, 0);
    EXPECT_EQ(chunked.chunk, 96);
    EXPECT_NE(one_shot.key(), chunked.key());
    EXPECT_EQ(param_of([&] { resolve_compression(request({ { "chunk", 32 } }), server); }), "kv_compression.chunk");
    EXPECT_EQ(param_of([&] { resolve_compression(request({ { "chunk", -1 } }), server); }), "kv_compression.chunk");
    EXPECT_EQ(resolve_compression(request({ { "chunk", 96 }, { "method", "h2o" } }), server).chunk, 96);  // streamed
    // Inherited from the server, the refusal says where the chunk came from and how to do without it.
    try {
        resolve_compression(request({ { "window", 130 }, { "budget", 200 } }), server);
        ADD_FAILURE() << "a window of 130 chunked by the server's --chunk 128 was accepted";
    } catch (const request_error & e) {
        EXPECT_NE(std::string(e.what()).find("the server's --chunk; send \"chunk\": 0"), std::string::npos) << e.what();
    }
    EXPECT_EQ(resolve_compression(request({ { "window", 130 }, { "budget", 200 }, { "chunk", 0 } }), server).chunk, 0);
}

// Every option of the table a client may set is taken from kv_compression (as a JSON number or string, as it is
// written in the row's kind); server-side ones (files) are refused naming the field.
TEST(serve, every_client_option_is_accepted) {
    const compression_defaults server = { ecokv::compression_named("snapkv+ecokv") };
    for (const ecokv::option_info & o : ecokv::compression_options()) {
        // A value other than the default and valid beside the others: window 8 < budget 64 < chunk 96, odd kernels.
        const json value = o.kind == ecokv::option_kind::choice   ? json(std::string(o.choices.back()))
                           : o.kind == ecokv::option_kind::method ? json("pyramidkv+mixkv")
                           : o.kind == ecokv::option_kind::path   ? json("scores.json")
                           : o.key == "window"                    ? json(8)
                           : o.key == "chunk"                     ? json(96)
                           : o.kind == ecokv::option_kind::number ? json(o.lo_open ? o.hi : (o.lo + std::min(o.hi, 1.0)) / 2)
                                                                  : json(int64_t(o.lo) + 66);
        const chat_request r = parse_chat_request(
            { { "messages", { { { "role", "user" }, { "content", "x" } } } }, { "kv_compression", { { o.key, value } } } },
            request_limits{});
        if (!o.client) {
            EXPECT_EQ(param_of([&] { resolve_compression(r, server); }), "kv_compression." + std::string(o.key));
            continue;
        }
        const compression c = resolve_compression(r, server);
        EXPECT_EQ(ecokv::option_text(ecokv::get_option(c, o.key)),
                  value.is_string() ? value.get<std::string>() : ecokv::option_text(value.is_number_integer()
                                                                                        ? ecokv::option_value(value.get<int64_t>())
                                                                                        : ecokv::option_value(value.get<double>())))
            << o.key;
        EXPECT_NE(c.key(), server.server.key()) << o.key;
    }
}

TEST(serve, requests_are_read_with_images_first) {
    const json body = { { "model", "tiny-vlm" },
                        { "max_tokens", 7 },
                        { "temperature", 0.5 },
                        { "stop", "\n" },
                        { "stream", true },
                        { "messages", { { { "role", "system" }, { "content", "Be brief." } },
                                        { { "role", "user" },
                                          { "content", { { { "type", "text" }, { "text", "What is the TOTAL?" } },
                                                         { { "type", "image_url" },
                                                           { "image_url", { { "url", "data:image/png;base64,aGk=" } } } } } } } } } };
    const chat_request r = parse_chat_request(body, {});
    ASSERT_EQ(r.messages.size(), 2u);
    EXPECT_EQ(r.messages[1].content, ecokv::llama::media_marker() + "\nWhat is the TOTAL?");
    ASSERT_EQ(r.images.size(), 1u);
    EXPECT_EQ(r.images[0], bytes("hi"));
    EXPECT_EQ(r.max_tokens, 7);
    EXPECT_EQ(r.temperature, 0.5);
    EXPECT_EQ(r.stop, std::vector<std::string>{ "\n" });
    EXPECT_TRUE(r.stream);
    EXPECT_FALSE(r.kv_compression.has_value());
    EXPECT_FALSE(r.kv_compression_off);
}

TEST(serve, bad_requests_name_the_field) {
    const json user = { { "role", "user" }, { "content", "hi" } };
    auto       with = [&](const char * key, const json & v) {
        json b = { { "messages", { user } } };
        b[key] = v;
        return b;
    };
    const request_limits l;
    EXPECT_EQ(param_of([&] { parse_chat_request(json::array(), l); }), "");
    EXPECT_EQ(param_of([&] { parse_chat_request(json::object(), l); }), "messages");
    EXPECT_EQ(param_of([&] { parse_chat_request({ { "messages", json::array() } }, l); }), "messages");
    EXPECT_EQ(param_of([&] { parse_chat_request({ { "messages", "hi" } }, l); }), "messages");
    EXPECT_EQ(param_of([&] { parse_chat_request({ { "messages", { { { "role", "robot" }, { "content", "x" } } } } }, l); }),
              "messages[0].role");
    EXPECT_EQ(param_of([&] { parse_chat_request({ { "messages", { { { "role", "user" } } } } }, l); }),
              "messages[0].content");
    EXPECT_EQ(param_of([&] { parse_chat_request({ { "messages", { { { "role", "user" }, { "content", 3 } } } } }, l); }),
              "messages[0].content");
    EXPECT_EQ(param_of([&] {
                  parse_chat_request({ { "messages", { user, { { "role", "assistant" }, { "content", "x" } } } } }, l);
              }),
              "messages");
    EXPECT_EQ(param_of([&] { parse_chat_request(with("max_tokens", 0), l); }), "max_tokens");
    EXPECT_EQ(param_of([&] { parse_chat_request(with("max_tokens", 100000), l); }), "max_tokens");
    EXPECT_EQ(param_of([&] { parse_chat_request(with("max_tokens", "5"), l); }), "max_tokens");
    EXPECT_EQ(param_of([&] { parse_chat_request(with("temperature", 3), l); }), "temperature");
    EXPECT_EQ(param_of([&] { parse_chat_request(with("stop", json::array({ 1 })), l); }), "stop");
    EXPECT_EQ(param_of([&] { parse_chat_request(with("stop", ""), l); }), "stop");  // would end every answer at once
    EXPECT_EQ(param_of([&] { parse_chat_request(with("stream", "yes"), l); }), "stream");
    EXPECT_EQ(param_of([&] { parse_chat_request(with("n", 2), l); }), "n");
    // A field of the wrong type inside a neutral field is refused too (json's value() would throw its own error).
    EXPECT_EQ(param_of([&] { parse_chat_request(with("response_format", { { "type", 1 } }), l); }), "response_format");
    EXPECT_EQ(param_of([&] { parse_chat_request(with("kv_compression", 5), l); }), "kv_compression");
    EXPECT_TRUE(parse_chat_request(with("kv_compression", false), l).kv_compression_off);
    EXPECT_EQ((*parse_chat_request(with("kv_compression", { { "budget", 32 } }), l).kv_compression)["budget"], 32);
}

std::shared_ptr<cached_conversation> conv(std::vector<uint64_t> units, size_t n_bytes) {
    auto c        = std::make_shared<cached_conversation>();
    c->units      = std::move(units);
    c->snap.state = std::vector<uint8_t>(n_bytes);
    c->full_bytes = 2 * n_bytes;
    return c;
}

TEST(serve, the_cache_finds_the_longest_prefix_and_evicts_the_least_recent) {
    conversation_cache cache(300);
    cache.put(conv({ 1, 2 }, 100));
    cache.put(conv({ 1, 2, 3, 4 }, 100));
    cache.put(conv({ 7 }, 100));
    EXPECT_EQ(cache.find({ 1, 2, 3, 4, 5 })->units.size(), 4u);  // the longest prefix
    EXPECT_EQ(cache.find({ 1, 2, 3 })->units.size(), 2u);        // {1,2,3,4} is not a prefix of it
    EXPECT_EQ(cache.find({ 8 }), nullptr);
    EXPECT_EQ(cache.totals_now().bytes, 300u);
    EXPECT_EQ(cache.totals_now().full_bytes, 600u);
    // Least recently used now: {7} (found last by nobody); a fourth conversation evicts it.
    cache.put(conv({ 9 }, 100));
    EXPECT_EQ(cache.find({ 7, 8 }), nullptr);
    EXPECT_EQ(cache.totals_now().evictions, 1u);
    // A conversation continued replaces the one it came from.
    const auto from = cache.find({ 9, 10 });
    cache.put(conv({ 9, 10 }, 50), from.get());
    EXPECT_EQ(cache.totals_now().conversations, 3u);
    EXPECT_EQ(cache.totals_now().bytes, 250u);
    // Larger than the whole limit: not kept, nothing evicted for it.
    cache.put(conv({ 5 }, 301));
    EXPECT_EQ(cache.find({ 5, 6 }), nullptr);
    EXPECT_EQ(cache.totals_now().conversations, 3u);
}

// The whole prompt kept already (an identical request, or one identical to a request still answering): a hit with
// nothing left to decode (the snapshot holds the next token's logits). A prompt shorter than every kept conversation
// finds the longest kept prefix of it. Two requests that kept the same units leave one entry; a prefix entry and a
// conversation are counted apart, and a conversation that continued a prefix entry does not replace it.
TEST(serve, the_cache_finds_equal_and_shorter_prompts_and_keeps_one_copy) {
    conversation_cache cache(1000);
    auto               prefix = conv({ 1, 2 }, 100);
    prefix->kind              = entry_kind::prefix;
    cache.put(prefix);
    cache.put(conv({ 1, 2, 3 }, 100));
    EXPECT_EQ(cache.find({ 1, 2, 3 })->units.size(), 3u);  // equal
    EXPECT_EQ(cache.find({ 1, 2 })->units.size(), 2u);     // shorter than {1,2,3}: the prefix entry
    EXPECT_EQ(cache.find({ 1 }), nullptr);
    cache.put(conv({ 1, 2, 3 }, 120));  // kept again by a request that ran alongside
    EXPECT_EQ(cache.totals_now().conversations, 1u);
    EXPECT_EQ(cache.totals_now().prefixes, 1u);
    EXPECT_EQ(cache.totals_now().bytes, 220u);
    cache.put(conv({ 1, 2, 4 }, 80));  // a new question about the prefix: it stays beside
    EXPECT_EQ(cache.totals_now().prefixes, 1u);
    EXPECT_EQ(cache.totals_now().conversations, 2u);
}

}  // namespace

// -t 0: the cores divided among the users computing now (requests prefilling or decoding alone, the decode loop),
// counted by hand; never fewer than one thread.
TEST(serve, running_requests_share_the_cores) {
    ecokv::serve::core_share two(2), sixteen(16), none(0);
    EXPECT_EQ(two.threads(), 2);  // nothing admitted yet: a request arriving has them all
    two.add_user(1);
    EXPECT_EQ(two.threads(), 2);
    two.add_user(1);
    EXPECT_EQ(two.threads(), 1);
    two.add_user(1);
    EXPECT_EQ(two.threads(), 1);
    two.add_user(-2);
    EXPECT_EQ(two.threads(), 2);
    sixteen.add_user(3);
    EXPECT_EQ(sixteen.threads(), 5);
    EXPECT_EQ(none.threads(), 1);
}

// --store's URL: host, port and database read, and every malformed form refused with the form it expects.
TEST(serve, store_urls_are_read_or_refused) {
    using ecokv::serve::store_options;
    const store_options a = store_options::from_url("redis://127.0.0.1:6380/2");
    EXPECT_EQ(a.host, "127.0.0.1");
    EXPECT_EQ(a.port, 6380);
    EXPECT_EQ(a.db, 2);
    const store_options b = store_options::from_url("redis://cache.internal");
    EXPECT_EQ(b.host, "cache.internal");
    EXPECT_EQ(b.port, 6379);
    EXPECT_EQ(b.db, 0);
    EXPECT_EQ(store_options::from_url("redis://[::1]:7000").host, "::1");
    for (const char * bad : { "", "127.0.0.1:6379", "http://127.0.0.1:6379", "redis://", "redis://host:port",
                              "redis://host:99999", "redis://host:6379/x", "redis://user:pw@host" }) {
        try {
            (void) store_options::from_url(bad);
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const ecokv::error & e) {
            EXPECT_NE(std::string(e.what()).find("redis://HOST[:PORT][/DB]"), std::string::npos) << e.what();
        }
    }
}

// Keys name the compression the same way in every replica: a fixed hash of its key, apart from token ids.
TEST(serve, the_compression_unit_is_a_stable_hash) {
    const std::string key = "snapkv+ecokv budget=100";
    EXPECT_EQ(ecokv::serve::compression_unit(key), XXH3_64bits(key.data(), key.size()) | (uint64_t(1) << 62));
    EXPECT_NE(ecokv::serve::compression_unit(key), ecokv::serve::compression_unit("full"));
    EXPECT_GE(ecokv::serve::compression_unit("full"), uint64_t(1) << 62);  // above every token id
}
