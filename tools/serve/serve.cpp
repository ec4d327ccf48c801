// ecokv serve: the OpenAI-compatible chat server (server.h). Parses options, loads the model, serves until SIGINT or
// SIGTERM. Without --model it serves the bundled tiny VLM with its projector.
#include "common/engine-flags.h"
#include "common/bundled.h"
#include "ecokv/error.h"
#include "decode-loop.h"
#include "server.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace {

using ecokv::error;
namespace el = ecokv::llama;

ecokv::serve::chat_server * g_server = nullptr;

void on_signal(int) {
    if (g_server != nullptr) {
        g_server->stop();
    }
}

// The first line of a secret's file, not empty.
std::string first_line(const std::string & path, const char * what) {
    std::ifstream in(path);
    std::string   line;
    if (!in || !std::getline(in, line) || line.empty()) {
        throw error(path + ": cannot read " + what + " from its first line");
    }
    return line;
}

// --store and its options; none without --store (and then none of them may be given).
std::optional<ecokv::serve::store_options> store_from(const cxxopts::ParseResult & args) {
    if (!args.count("store")) {
        for (const char * o : { "store-password-file", "store-ttl", "store-prefix" }) {
            if (args.count(o)) {
                throw error(std::string("--") + o + " needs --store");
            }
        }
        return std::nullopt;
    }
    auto o   = ecokv::serve::store_options::from_url(args["store"].as<std::string>());
    o.ttl_s  = ecokv::tools::int_in_range(args, "store-ttl", 1, 365 * 86400);
    o.prefix = args["store-prefix"].as<std::string>();
    if (args.count("store-password-file")) {
        o.password = first_line(args["store-password-file"].as<std::string>(), "a Redis password");
    }
    return o;
}

// --api-key, or the first line of --api-key-file (not both); empty: no key.
std::string api_key_from(const cxxopts::ParseResult & args) {
    if (args.count("api-key") && args.count("api-key-file")) {
        throw error("give --api-key or --api-key-file, not both");
    }
    std::string key = args.count("api-key") ? args["api-key"].as<std::string>() : "";
    if (args.count("api-key-file")) {
        key = first_line(args["api-key-file"].as<std::string>(), "an API key");
    }
    if (args.count("api-key") && key.empty()) {
        throw error("--api-key is empty");
    }
    return key;
}

}  // namespace

int ecokv_serve(int argc, char ** argv) {
    return ecokv::tools::run_command("serve", [&] {
        cxxopts::Options options("ecokv serve", "An OpenAI-compatible chat server whose conversations live in "
                                                "compressed, reusable KV caches. Without --model: the bundled tiny VLM.");
        // clang-format off
        options.add_options()
            ("model", "GGUF model (default: the bundled tiny VLM with its mmproj)", cxxopts::value<std::string>())
            ("mmproj", "multimodal projector GGUF (libmtmd)", cxxopts::value<std::string>())
            ("host", "address to listen on", cxxopts::value<std::string>()->default_value("127.0.0.1"))
            ("port", "port (0: any free port, printed and written to --port-file)", cxxopts::value<int32_t>()->default_value("8080"))
            ("port-file", "write the port listened on to this file once serving", cxxopts::value<std::string>())
            ("slots", "requests at once: the most sequences of the decode loop, admitted while their KV memory fits -c", cxxopts::value<int32_t>()->default_value("8"))
            ("kv-kept-rows", "rows of every KV head the decode loop keeps for compressed prompts' kept entries, of the -c rows (default: half when compressing, else 0)", cxxopts::value<int32_t>())
            ("no-batch", "each request decodes in its own context (no decode loop)")
            ("lanes", "pieces of engine work the decode loop runs at once (prefills beside its steps), on cores / N threads each beside others, on every core alone; each loads a copy of the projector (default: 2 on the CPU, 1 offloaded)", cxxopts::value<int32_t>())
            ("queue", "requests waiting for a slot; more get HTTP 503", cxxopts::value<int32_t>()->default_value("16"))
            ("cache-mib", "memory for kept conversations, least recently used evicted first", cxxopts::value<int32_t>()->default_value("256"))
            ("max-tokens", "tokens generated when a request gives no max_tokens", cxxopts::value<int32_t>()->default_value("128"))
            ("full", "keep full caches unless a request asks for kv_compression")
            ("model-name", "the name /v1/models lists (default: the model file's name)", cxxopts::value<std::string>())
            ("max-connections", "HTTP connections open at once; past it a 503 and the connection closed", cxxopts::value<int32_t>()->default_value("256"))
            ("request-timeout", "seconds a connection has to send a request's headers and body", cxxopts::value<int32_t>()->default_value("10"))
            ("api-key", "require 'Authorization: Bearer KEY' on every endpoint but /health", cxxopts::value<std::string>())
            ("api-key-file", "read the API key from this file's first line", cxxopts::value<std::string>())
            ("store", "share kept conversations with other replicas through Redis: redis://HOST[:PORT][/DB]", cxxopts::value<std::string>())
            ("store-password-file", "Redis AUTH password: this file's first line", cxxopts::value<std::string>())
            ("store-ttl", "seconds a stored entry lives after its last write", cxxopts::value<int32_t>()->default_value("3600"))
            ("store-prefix", "prefix of every store key (clusters sharing one Redis)", cxxopts::value<std::string>()->default_value("ecokv:"))
            ("verbose", "show llama.cpp's log")
            ("h,help", "show this help");
        // clang-format on
        // A request's kv_compression fields override the method options (and --chunk) per conversation.
        ecokv::tools::add_compression_options(options, ecokv::scope_method | ecokv::scope_prefill |
                                                           ecokv::scope_decode | ecokv::scope_turns);
        ecokv::tools::add_engine_options(options);
        const auto parsed = ecokv::tools::parse_engine_command(options, argc, argv);
        if (!parsed) {
            return 0;
        }
        const cxxopts::ParseResult & args = *parsed;
        el::set_verbose(args.count("verbose") > 0);

        ecokv::serve::serve_options so;
        so.host        = args["host"].as<std::string>();
        so.port        = ecokv::tools::int_in_range(args, "port", 0, 65535);
        so.slots       = ecokv::tools::int_in_range(args, "slots", 1, 256);
        so.queue       = ecokv::tools::int_in_range(args, "queue", 0, 4096);
        so.cache_bytes = uint64_t(ecokv::tools::int_in_range(args, "cache-mib", 0, 1 << 20)) << 20;
        so.limits.max_tokens_default = ecokv::tools::int_in_range(args, "max-tokens", 1, 1 << 20);
        so.api_key     = api_key_from(args);
        so.store       = store_from(args);
        so.max_connections   = ecokv::tools::int_in_range(args, "max-connections", 1, 16384);
        so.request_timeout_s = ecokv::tools::int_in_range(args, "request-timeout", 1, 3600);
        so.kv.compress = args.count("full") == 0;
        so.batch       = args.count("no-batch") == 0;
        if (args.count("kv-kept-rows")) {
            if (!so.batch) {
                throw error("--kv-kept-rows sizes the decode loop, which --no-batch turns off");
            }
            so.kv_kept_rows = ecokv::tools::int_in_range(args, "kv-kept-rows", 0, 1 << 24);
        }
        so.kv.server   = ecokv::tools::compression_from(args);
        so.kv.server.validate();  // now, as a request without kv_compression would use them

        const bool          bundled = args.count("model") == 0;
        el::session_options sopt = ecokv::tools::engine_options_from(args);
        const int32_t n_threads = sopt.n_threads > 0 ? sopt.n_threads : el::default_thread_count();
        if (args.count("lanes") && !so.batch) {
            throw error("--lanes splits the decode loop's work, which --no-batch turns off");
        }
        if (so.batch) {  // a piece of work alone computes on every core, pieces beside others on their lane's share
            const bool offload = el::gpu_offload_supported() && sopt.n_gpu_layers != 0 && sopt.devices != "none";
            so.lanes = args.count("lanes") ? ecokv::tools::int_in_range(args, "lanes", 1, 64)
                                           : offload ? 1 : std::min(2, n_threads);
            so.cores          = n_threads;
            sopt.n_projectors = so.lanes;
            sopt.threads_now  = [n_threads] {
                const int32_t n = ecokv::serve::decode_loop::lane_threads();
                return n > 0 ? n : n_threads;
            };
        } else if (sopt.n_threads == 0) {  // requests running at once share the cores; a lone one has them all
            so.core_users    = std::make_shared<ecokv::serve::core_share>(n_threads);
            sopt.threads_now = [cores = so.core_users] { return cores->threads(); };
        }
        sopt.model_path  = bundled ? ecokv::tools::bundled_file("tiny-vlm.gguf") : args["model"].as<std::string>();
        sopt.mmproj_path = args.count("mmproj") ? args["mmproj"].as<std::string>()
                           : bundled            ? ecokv::tools::bundled_file("tiny-vlm-mmproj.gguf")
                                                : "";
        so.model_name    = args.count("model-name") ? args["model-name"].as<std::string>()
                                                    : std::filesystem::path(sopt.model_path).stem().string();
        const el::session session(sopt);

        ecokv::serve::chat_server server(session, so);
        if (server.bind() <= 0) {
            throw error("cannot listen on " + so.host + ":" + std::to_string(so.port) + " (in use, or not an address)");
        }
        std::signal(SIGPIPE, SIG_IGN);  // a client that went away is seen as a failed write
        g_server = &server;
        std::signal(SIGINT, on_signal);
        std::signal(SIGTERM, on_signal);
        const std::string threads =
            so.batch        ? std::to_string(n_threads) + " threads, one decode loop, " + std::to_string(so.lanes) + " lane(s)"
            : so.core_users ? std::to_string(n_threads) + " cores shared"
                            : std::to_string(n_threads) + " threads each";
        std::fprintf(stderr, "ecokv serve: %s on http://%s:%d (%d slots, %s, queue %d, cache %d MiB, %s)\n",
                     so.model_name.c_str(), so.host.c_str(), server.port(), so.slots, threads.c_str(), so.queue,
                     int(so.cache_bytes >> 20), so.kv.compress ? "compressed conversations" : "full caches");
        if (so.store) {
            std::fprintf(stderr, "ecokv serve: shared store redis://%s:%d/%d, keys %s*, entries expire after %d s\n",
                         so.store->host.c_str(), so.store->port, so.store->db, so.store->prefix.c_str(), so.store->ttl_s);
        }
        if (args.count("port-file")) {
            const std::string path = args["port-file"].as<std::string>();
            std::ofstream(path + ".tmp") << server.port() << "\n";
            std::filesystem::rename(path + ".tmp", path);
        }
        const bool ok = server.listen();
        g_server      = nullptr;
        return ok ? 0 : 1;
    });
}
