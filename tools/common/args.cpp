#include "common/args.h"

#include "ecokv/error.h"

#include <cstdint>
#include <cstdio>
#include <sstream>

namespace ecokv::tools {

void add_method_options(cxxopts::Options & options, const char * default_method) {
    const method_params d;
    auto                method = cxxopts::value<std::string>();
    if (default_method != nullptr) {
        method->default_value(default_method);
    }
    // clang-format off
    options.add_options("method")
        ("m,method", "ALLOCATOR+SCORER, a scorer or an allocator (see --list-methods)", method)
        ("b,budget", "tokens kept per KV head, window included", cxxopts::value<int32_t>()->default_value(std::to_string(d.budget)))
        ("window", "observation window N (default: the scorer's)", cxxopts::value<int32_t>())
        ("kernel", "pooling kernel (odd)", cxxopts::value<int32_t>()->default_value(std::to_string(d.kernel)))
        ("pool", "pooling: avg or max", cxxopts::value<std::string>()->default_value("avg"))
        ("alpha", "ECOKV: Euclidean weight in the diversity", cxxopts::value<double>()->default_value("0.8"))
        ("beta", "ECOKV: rE weight in the redundancy", cxxopts::value<double>()->default_value("0.6"))
        ("tau", "ECOKV: rE temperature (0: sqrt(head_dim))", cxxopts::value<double>()->default_value("0"))
        ("centroid", "ECOKV/MixKV/KeyDiff centroid over: all or prefix", cxxopts::value<std::string>()->default_value("all"))
        ("mixkv-scale", "MixKV: diversity matched to mean attention (the official code) or to mean importance (ECOKV App. A.1): attention or importance", cxxopts::value<std::string>()->default_value("attention"))
        ("ecokv-weights", "ECOKV: alpha and beta weight the Euclidean terms (Eq. 3/6) or the cosine ones (Figure 3's text): equations or figure3", cxxopts::value<std::string>()->default_value("equations"))
        ("floor-ratio", "AdaKV/MadaKV floor (0.2), SparseMM uniform part (0.1)", cxxopts::value<double>())
        ("pyramid-beta", "PyramidKV shape", cxxopts::value<int32_t>()->default_value(std::to_string(d.pyramid_beta)))
        ("theta", "MadaKV: attention mass a head's demand covers", cxxopts::value<double>()->default_value("0.9"))
        ("sinks", "StreamingLLM: leading tokens kept", cxxopts::value<int32_t>()->default_value(std::to_string(d.n_sink)))
        ("head-scores", "SparseMM head-score JSON (official format)", cxxopts::value<std::string>())
        ("seed", "random scorer seed", cxxopts::value<uint64_t>()->default_value("0"))
        ("merge", "merge evicted K/V: none or pivot (LOOK-M)", cxxopts::value<std::string>()->default_value("none"));
    // clang-format on
}

std::optional<cxxopts::ParseResult> parse_with_method_options(cxxopts::Options & options, int argc, char ** argv,
                                                              const char * default_method) {
    add_method_options(options, default_method);
    auto args = options.parse(argc, argv);
    if (args.count("help")) {
        std::printf("%s\n", options.help({ "", "method" }).c_str());
        return std::nullopt;
    }
    reject_positional(args);
    return args;
}

method_params method_params_from(const cxxopts::ParseResult & args) {
    method_params p;
    p.budget = args["budget"].as<int32_t>();
    if (args.count("window")) {
        p.window = args["window"].as<int32_t>();
        if (p.window < 1) {
            throw error("--window " + std::to_string(p.window) + " must be at least 1");
        }
    }
    p.kernel = args["kernel"].as<int32_t>();
    const std::string pool = args["pool"].as<std::string>();
    if (pool != "avg" && pool != "max") {
        throw error("--pool must be avg or max, not '" + pool + "'");
    }
    p.pool     = pool == "avg" ? pool_kind::avg : pool_kind::max;
    p.alpha    = args["alpha"].as<double>();
    p.beta     = args["beta"].as<double>();
    p.tau      = args["tau"].as<double>();
    const std::string centroid = args["centroid"].as<std::string>();
    if (centroid != "all" && centroid != "prefix") {
        throw error("--centroid must be all or prefix, not '" + centroid + "'");
    }
    p.centroid = centroid == "all" ? centroid_kind::all : centroid_kind::prefix;
    const std::string scale = args["mixkv-scale"].as<std::string>();
    if (scale != "attention" && scale != "importance") {
        throw error("--mixkv-scale must be attention or importance, not '" + scale + "'");
    }
    p.mixkv_scale = scale == "attention" ? mixkv_scale_kind::attention : mixkv_scale_kind::importance;
    const std::string weights = args["ecokv-weights"].as<std::string>();
    if (weights != "equations" && weights != "figure3") {
        throw error("--ecokv-weights must be equations or figure3, not '" + weights + "'");
    }
    p.ecokv_weights = weights == "equations" ? ecokv_weights_kind::equations : ecokv_weights_kind::figure3;
    if (args.count("floor-ratio")) {
        p.floor_ratio = args["floor-ratio"].as<double>();
        if (p.floor_ratio < 0) {
            throw error("--floor-ratio must lie in [0, 1]");
        }
    }
    p.pyramid_beta = args["pyramid-beta"].as<int32_t>();
    p.theta        = args["theta"].as<double>();
    p.n_sink       = args["sinks"].as<int32_t>();
    if (args.count("head-scores")) {
        p.head_scores = args["head-scores"].as<std::string>();
    }
    p.seed = args["seed"].as<uint64_t>();
    const std::string merge = args["merge"].as<std::string>();
    if (merge != "none" && merge != "pivot") {
        throw error("--merge must be none or pivot, not '" + merge + "'");
    }
    p.merge = merge == "pivot" ? merge_kind::pivot : merge_kind::none;
    return p;
}

int32_t int_in_range(const cxxopts::ParseResult & args, const char * name, int32_t lo, int32_t hi) {
    const int32_t v = args[name].as<int32_t>();
    if (v < lo || v > hi) {
        throw error("--" + std::string(name) + " " + std::to_string(v) + " must lie in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
    }
    return v;
}

int32_t threads_from(const cxxopts::ParseResult & args) { return int_in_range(args, "threads", 0, 512); }

std::vector<std::string> split_list(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream        in(s);
    for (std::string part; std::getline(in, part, ',');) {
        if (!part.empty()) {
            out.push_back(part);
        }
    }
    return out;
}

void require(const cxxopts::ParseResult & args, std::initializer_list<const char *> names) {
    for (const char * n : names) {
        if (args.count(n) == 0) {
            throw error(std::string("missing --") + n + " (see --help)");
        }
    }
}

void reject_positional(const cxxopts::ParseResult & args) {
    if (!args.unmatched().empty()) {
        throw error("unexpected argument '" + args.unmatched().front() + "'");
    }
}

namespace {

// A message cut to about n bytes in its middle ("Option 'xxx...xxx' does not exist"): cxxopts quotes an unknown
// option whole, however long. Cuts fall on UTF-8 character boundaries.
std::string shortened(std::string m, size_t n) {
    if (m.size() <= n) {
        return m;
    }
    auto boundary = [&](size_t i) {
        while (i > 0 && i < m.size() && (uint8_t(m[i]) & 0xC0) == 0x80) {
            --i;
        }
        return i;
    };
    const size_t head = boundary(n * 2 / 3), tail = boundary(m.size() - n / 3);
    return m.substr(0, head) + "..." + m.substr(tail);
}

}  // namespace

int run_command(const char * name, const std::function<int()> & body) {
    try {
        return body();
    } catch (const error & e) {
        std::fprintf(stderr, "ecokv %s: error: %s\n", name, e.what());
    } catch (const cxxopts::exceptions::exception & e) {
        std::fprintf(stderr, "ecokv %s: error: %s (see --help)\n", name, shortened(e.what(), 160).c_str());
    } catch (const std::exception & e) {
        std::fprintf(stderr, "ecokv %s: error: %s\n", name, e.what());
    }
    return 1;
}

}  // namespace ecokv::tools
