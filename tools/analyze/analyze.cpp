// ecokv analyze: the ECOKV paper's analyses of a capture file (ecokv/analysis.h): key cosine distribution per
// layer (Figure 1), rC / rE / lambda per layer and head (Figures 7-8), importance-diversity rank correlation per
// layer (Figures 4 and 6), the selection rate of the last 32 tokens and the kept share of every token under a method
// (Figure 5, kept-token maps). Writes DIR/analysis.json and prints a per-layer table.
#include "common/args.h"
#include "ecokv/analysis.h"
#include "ecokv/capture.h"
#include "ecokv/error.h"
#include "ecokv/safetensors.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

namespace {

using json = nlohmann::json;

double mean(const std::vector<double> & v) {
    double s = 0;
    for (double x : v) {
        s += x;
    }
    return v.empty() ? 0.0 : s / double(v.size());
}

// Per-layer means over the KV heads, and the layer's pooled cosine histogram.
json layer_summary(const ecokv::capture_analysis & a, int32_t il, int32_t n_kv_heads) {
    std::vector<double> rc, re, lambda, rho, dup, cos;
    std::vector<double> hist;
    for (int32_t ig = 0; ig < n_kv_heads; ++ig) {
        const ecokv::head_analysis & h = a.heads[size_t(il) * size_t(n_kv_heads) + size_t(ig)];
        rc.push_back(h.r_c), re.push_back(h.r_e), lambda.push_back(h.lambda), rho.push_back(h.spearman);
        dup.push_back(h.near_duplicates), cos.push_back(h.pair_cos_mean);
        hist.resize(h.cos_hist.size(), 0.0);
        for (size_t b = 0; b < hist.size(); ++b) {
            hist[b] += h.cos_hist[b] / n_kv_heads;
        }
    }
    return { { "layer", il },           { "r_c", mean(rc) },       { "r_e", mean(re) },
             { "lambda", mean(lambda) }, { "spearman", mean(rho) }, { "near_duplicates", mean(dup) },
             { "pair_cos_mean", mean(cos) }, { "cos_hist", hist } };
}

json to_json(const ecokv::capture_analysis & a, const ecokv::capture_view & v, const ecokv::analysis_options & o,
             const std::string & input) {
    json heads = json::array(), layers = json::array();
    for (const ecokv::head_analysis & h : a.heads) {
        heads.push_back({ { "layer", h.layer },
                          { "kv_head", h.kv_head },
                          { "n_pair_keys", h.n_pair_keys },
                          { "pair_cos_mean", h.pair_cos_mean },
                          { "cos_hist", h.cos_hist },
                          { "near_duplicates", h.near_duplicates },
                          { "r_c", h.r_c },
                          { "mean_dist", h.mean_dist },
                          { "r_e", h.r_e },
                          { "lambda", h.lambda },
                          { "spearman", h.spearman } });
    }
    for (int32_t il = 0; il < v.n_layers; ++il) {
        layers.push_back(layer_summary(a, il, v.n_kv_heads));
    }
    return { { "input", std::filesystem::path(input).filename().string() },
             { "model", v.model },
             { "n_tokens", v.n_tokens },
             { "modality", v.modality },
             { "method", a.sel.method },
             { "budget", a.sel.budget },
             { "window", a.sel.window },
             { "cos_bins", o.n_bins },
             { "duplicate_cos", o.duplicate_cos },
             { "layers", layers },
             { "heads", heads },
             { "recent_kept", a.recent_kept },
             { "kept_share", a.kept_share } };
}

void print_table(const json & j) {
    std::printf("%s on %d tokens; %s, budget %d, window %d\n", j["model"].get<std::string>().c_str(),
                j["n_tokens"].get<int>(), j["method"].get<std::string>().c_str(), j["budget"].get<int>(),
                j["window"].get<int>());
    std::printf("%5s %9s %7s %7s %7s %9s %10s\n", "layer", "mean cos", "rC", "rE", "lambda", "spearman", "near-dup");
    for (const json & l : j["layers"]) {
        std::printf("%5d %9.3f %7.3f %7.3f %7.3f %9.3f %10.3f\n", l["layer"].get<int>(), l["pair_cos_mean"].get<double>(),
                    l["r_c"].get<double>(), l["r_e"].get<double>(), l["lambda"].get<double>(),
                    l["spearman"].get<double>(), l["near_duplicates"].get<double>());
    }
    std::printf("last %zu tokens kept (share of heads, oldest first):", j["recent_kept"].size());
    for (const json & r : j["recent_kept"]) {
        std::printf(" %.2f", r.get<double>());
    }
    std::printf("\n");
}

}  // namespace

int ecokv_analyze(int argc, char ** argv) {
    return ecokv::tools::run_command("analyze", [&] {
        cxxopts::Options options("ecokv analyze", "The ECOKV paper's analyses of a capture (ecokv run --dump-capture): "
                                                  "key geometry, redundancy, importance-diversity correlation and "
                                                  "what a method keeps.");
        // clang-format off
        options.add_options()
            ("i,input", "capture file (safetensors, SPEC §7)", cxxopts::value<std::string>())
            ("out", "directory to write analysis.json into", cxxopts::value<std::string>())
            ("bins", "bins of the pairwise key cosine histogram over [-1, 1]", cxxopts::value<int32_t>()->default_value("20"))
            ("max-pair-keys", "pairwise statistics over at most N evenly spaced keys per head", cxxopts::value<int32_t>()->default_value("1024"))
            ("t,threads", "threads (0: all cores)", cxxopts::value<int32_t>()->default_value("0"))
            ("h,help", "show this help");
        // clang-format on
        ecokv::tools::add_method_options(options, "snapkv+ecokv");
        const auto args = options.parse(argc, argv);
        ecokv::tools::reject_positional(args);
        if (args.count("help")) {
            std::printf("%s\n", options.help({ "", "method" }).c_str());
            return 0;
        }
        ecokv::tools::require(args, { "input", "out" });
        const ecokv::method_spec   spec   = ecokv::parse_method(args["method"].as<std::string>());
        const ecokv::method_params params = ecokv::tools::method_params_from(args);
        params.validate(ecokv::method_window(spec, params));
        ecokv::analysis_options o;
        o.n_bins        = ecokv::tools::int_in_range(args, "bins", 1, 1000);
        o.max_pair_keys = ecokv::tools::int_in_range(args, "max-pair-keys", 2, 16384);  // n^2 / 2 dot products per head
        o.n_threads     = ecokv::tools::threads_from(args);

        const std::string          input = args["input"].as<std::string>();
        const ecokv::capture_file  cap   = ecokv::capture_file::open(input);
        const ecokv::capture_analysis a  = [&] {
            try {
                return ecokv::analyze(cap.view(), spec, params, o);
            } catch (const ecokv::error & e) {  // name the capture in data errors (NaN, too short)
                throw ecokv::error(input + ": " + e.what());
            }
        }();
        const json                 j   = to_json(a, cap.view(), o, input);
        const std::filesystem::path dir = args["out"].as<std::string>();
        std::filesystem::create_directories(dir);
        ecokv::write_file_atomic((dir / "analysis.json").string(), j.dump(1) + "\n");
        print_table(j);
        std::printf("wrote %s\n", (dir / "analysis.json").string().c_str());
        return 0;
    });
}
