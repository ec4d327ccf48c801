// ecokv synth-capture: write a realistic random capture (SPEC §7) for demos, tests and benchmarks.
#include "common/args.h"
#include "ecokv/capture.h"
#include "ecokv/error.h"
#include "ecokv/synth.h"

#include <cstdio>

namespace {

std::pair<int32_t, int32_t> parse_span(const std::string & s) {
    const size_t colon = s.find(':');
    try {
        if (colon != std::string::npos) {
            size_t      n1 = 0, n2 = 0;
            const int a  = std::stoi(s.substr(0, colon), &n1);
            const int b  = std::stoi(s.substr(colon + 1), &n2);
            if (n1 == colon && n2 == s.size() - colon - 1) {
                return { a, b };
            }
        }
    } catch (const std::exception &) {
    }
    throw ecokv::error("--image-tokens '" + s + "' must be BEGIN:END (token indices, END exclusive)");
}

}  // namespace

int ecokv_synth_capture(int argc, char ** argv) {
    return ecokv::tools::run_command("synth-capture", [&] {
        const ecokv::synth_params d;
        cxxopts::Options          options("ecokv synth-capture", "Write a realistic random capture.");
        // clang-format off
        options.add_options()
            ("layers", "layers", cxxopts::value<int32_t>()->default_value(std::to_string(d.n_layers)))
            ("heads", "query heads", cxxopts::value<int32_t>()->default_value(std::to_string(d.n_heads)))
            ("kv-heads", "KV heads", cxxopts::value<int32_t>()->default_value(std::to_string(d.n_kv_heads)))
            ("head-dim", "key/query head dimension", cxxopts::value<int32_t>()->default_value(std::to_string(d.head_dim)))
            ("head-dim-v", "value head dimension (default: --head-dim)", cxxopts::value<int32_t>()->default_value("0"))
            ("tokens", "prompt tokens T", cxxopts::value<int32_t>()->default_value(std::to_string(d.n_tokens)))
            ("queries", "window queries captured", cxxopts::value<int32_t>()->default_value(std::to_string(d.n_queries)))
            ("image-tokens", "image token range BEGIN:END (repeatable)", cxxopts::value<std::vector<std::string>>())
            ("full-queries", "also write the queries of every token (h2o, lookm)")
            ("dtype", "f32 or f16", cxxopts::value<std::string>()->default_value("f32"))
            ("seed", "random seed", cxxopts::value<uint64_t>()->default_value("0"))
            ("o,output", "capture file to write", cxxopts::value<std::string>())
            ("h,help", "show this help");
        // clang-format on
        const auto args = options.parse(argc, argv);
        ecokv::tools::reject_positional(args);
        if (args.count("help")) {
            std::printf("%s\n", options.help().c_str());
            return 0;
        }
        ecokv::tools::require(args, { "output" });
        ecokv::synth_params p;
        p.n_layers     = args["layers"].as<int32_t>();
        p.n_heads      = args["heads"].as<int32_t>();
        p.n_kv_heads   = args["kv-heads"].as<int32_t>();
        p.head_dim     = args["head-dim"].as<int32_t>();
        p.head_dim_v   = args["head-dim-v"].as<int32_t>();
        if (p.head_dim_v < 0) {  // make_synth_capture reads any value <= 0 as "same as --head-dim"
            throw ecokv::error("--head-dim-v " + std::to_string(p.head_dim_v) + " must be positive (0: --head-dim)");
        }
        p.n_tokens     = args["tokens"].as<int32_t>();
        p.n_queries    = args["queries"].as<int32_t>();
        p.full_queries = args.count("full-queries") > 0;
        p.seed         = args["seed"].as<uint64_t>();
        const std::string type = args["dtype"].as<std::string>();
        if (type != "f32" && type != "f16") {
            throw ecokv::error("--dtype must be f32 or f16, not '" + type + "'");
        }
        p.type = type == "f32" ? ecokv::dtype::f32 : ecokv::dtype::f16;
        if (args.count("image-tokens")) {
            for (const std::string & s : args["image-tokens"].as<std::vector<std::string>>()) {
                p.image_spans.push_back(parse_span(s));
            }
        }
        const ecokv::owned_capture cap = ecokv::make_synth_capture(p);
        ecokv::write_capture(args["output"].as<std::string>(), cap.view(),
                             { { "generator", "ecokv synth-capture" }, { "seed", std::to_string(p.seed) } });
        std::printf("wrote %s: %d layers, %d/%d heads, head_dim %d, %d tokens\n", args["output"].as<std::string>().c_str(),
                    p.n_layers, p.n_heads, p.n_kv_heads, p.head_dim, p.n_tokens);
        return 0;
    });
}
