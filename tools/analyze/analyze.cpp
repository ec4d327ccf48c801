// ecokv analyze: the ECOKV paper's analyses (ecokv/analysis.h) of a model reading a prompt (the options of ecokv run;
// the bundled tiny VLM on its sample by default) or of a capture file: key cosine distribution per layer (Figure 1),
// rC / rE / lambda per layer and head (Figures 7-8), importance-diversity rank correlation per layer (Figures 4 and
// 6), the selection rate of the last 32 tokens and the kept share of every token under a method (Figure 5, kept-token
// maps over each image). Writes DIR/analysis.json, prints a per-layer table, and draws DIR/*.png with
// scripts/plot-analysis.py when python3 has matplotlib.
#include "common/args.h"
#ifdef ECOKV_HAVE_LLAMA
#include "common/engine-flags.h"
#include "ecokv/llama-options.h"
#endif
#include "common/bundled.h"
#include "ecokv/analysis.h"
#include "ecokv/capture.h"
#include "ecokv/error.h"
#include "ecokv/safetensors.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#ifdef ECOKV_HAVE_LLAMA
#    include "analyze/from-model.h"
#    include "common/prompt-options.h"
#endif

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
             const json & source) {
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
    json out = { { "input", source["input"] },
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
             { "kept_share", a.kept_share },
             { "kept_share_by_layer", a.kept_share_by_layer },
             { "images", source.value("images", json::array()) } };
    if (source.contains("question_mode")) {
        out["question_mode"] = source["question_mode"];
    }
    return out;
}

// Shell-quoted for /bin/sh.
std::string quoted(const std::string & s) {
    std::string q = "'";
    for (char c : s) {
        q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    }
    return q + "'";
}

// $ECOKV_PYTHON, else Debian's python3 (which has the apt packages, matplotlib among them), else the first on PATH.
std::string python() {
    if (const char * env = std::getenv("ECOKV_PYTHON"); env != nullptr && *env != '\0') {
        return env;
    }
    return std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

// The figures from analysis.json, by scripts/plot-analysis.py (matplotlib); a missing python3 or matplotlib only
// skips them.
void draw_plots(const std::filesystem::path & dir) {
    const std::filesystem::path script =
        std::filesystem::path(ecokv::tools::bundled_models_dir()) / ".." / "scripts" / "plot-analysis.py";
    if (!std::filesystem::is_regular_file(script)) {
        std::printf("plots skipped: %s is missing\n", script.lexically_normal().string().c_str());
        return;
    }
    std::fflush(stdout);  // before the script's own output
    const int rc = std::system((quoted(python()) + " " + quoted(script.string()) + " " + quoted(dir.string())).c_str());
    if (rc != 0) {
        std::printf("plots skipped (python3 with matplotlib is needed: scripts/setup.sh --training installs it)\n");
    }
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
        cxxopts::Options options("ecokv analyze", "The ECOKV paper's analyses of a model reading a prompt (the options "
                                                  "of ecokv run) or of a capture file: key geometry, redundancy, "
                                                  "importance-diversity correlation and what a method keeps.");
        // clang-format off
        options.add_options()
            ("i,input", "analyse this capture file (safetensors, SPEC §7) instead of running a model", cxxopts::value<std::string>())
            ("out", "directory to write analysis.json and the plots into", cxxopts::value<std::string>())
            ("bins", "bins of the pairwise key cosine histogram over [-1, 1]", cxxopts::value<int32_t>()->default_value("20"))
            ("max-pair-keys", "pairwise statistics over at most N evenly spaced keys per head", cxxopts::value<int32_t>()->default_value("1024"))
            ("no-plots", "write analysis.json only")
            ("h,help", "show this help");
        // clang-format on
#ifdef ECOKV_HAVE_LLAMA
        ecokv::tools::add_prompt_options(
            options, "question-agnostic mode: analyse the prompt compressed before any question is seen (the "
                     "questions are not answered; repeatable)");
#else
        options.add_options()("t,threads", "threads (0: all cores)", cxxopts::value<int32_t>()->default_value("0"));
#endif
        ecokv::tools::add_compression_options(options, ecokv::scope_method);
#ifdef ECOKV_HAVE_LLAMA
        const auto parsed = ecokv::tools::parse_engine_command(options, argc, argv);
#else
        const auto parsed = ecokv::tools::parse_options(options, argc, argv);
#endif
        if (!parsed) {
            return 0;
        }
        const cxxopts::ParseResult & args = *parsed;
        ecokv::tools::require(args, { "out" });
        const ecokv::compression   c      = ecokv::tools::compression_from(args);
        c.validate();
        const ecokv::method_spec &   spec   = c.spec;
        const ecokv::method_params & params = c.params;
        ecokv::analysis_options o;
        o.n_bins        = ecokv::tools::int_in_range(args, "bins", 1, 1000);
        o.max_pair_keys = ecokv::tools::int_in_range(args, "max-pair-keys", 2, 16384);  // n^2 / 2 dot products per head
#ifdef ECOKV_HAVE_LLAMA
        o.n_threads     = ecokv::tools::engine_options_from(args).n_threads;
#else
        o.n_threads     = ecokv::tools::threads_from(args);
#endif
        const std::filesystem::path dir = args["out"].as<std::string>();

        const auto analyse = [&](const ecokv::capture_view & view, const json & source) {
            const ecokv::capture_analysis a = [&] {
                try {
                    return ecokv::analyze(view, spec, params, o);
                } catch (const ecokv::error & e) {  // name the input in data errors (NaN, too short)
                    throw ecokv::error(source["input"].get<std::string>() + ": " + e.what());
                }
            }();
            const json j = to_json(a, view, o, source);
            std::filesystem::create_directories(dir);
            ecokv::write_file_atomic((dir / "analysis.json").string(), j.dump(1) + "\n");
            print_table(j);
            std::printf("wrote %s\n", (dir / "analysis.json").string().c_str());
        };
        if (args.count("input")) {
#ifdef ECOKV_HAVE_LLAMA
            std::vector<std::string> model_flags = { "model", "mmproj", "image", "prompt", "file", "question" };
            for (const ecokv::llama::engine_option & e : ecokv::llama::engine_options()) {
                if (e.key != "threads") {  // threads also serve the analysis of a capture
                    model_flags.push_back(e.flag());
                }
            }
            for (const std::string & o : model_flags) {
                if (args.count(o)) {
                    throw ecokv::error(std::string("--input analyses a capture file; --") + o +
                                       " belongs to a model run: give one or the other");
                }
            }
#endif
            const std::string         input = args["input"].as<std::string>();
            const ecokv::capture_file cap   = ecokv::capture_file::open(input);
            analyse(cap.view(), { { "input", std::filesystem::path(input).filename().string() } });
        } else {
#ifdef ECOKV_HAVE_LLAMA
            ecokv::method_requirements needs = ecokv::requirements(spec, params);
            needs.n_window_queries = std::max(needs.n_window_queries, ecokv::method_window(spec, params));
            ecokv::tools::with_model_capture(args, needs, analyse);
#else
            throw ecokv::error("missing --input (this build has no llama.cpp to run a model)");
#endif
        }
        if (args.count("no-plots") == 0) {
            draw_plots(dir);
        }
        return 0;
    });
}
