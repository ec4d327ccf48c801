// ecokv eval: options in, the evaluation runner (ecokv/eval-runner.h) on a llama.cpp session, progress out.
#include "common/engine-flags.h"
#include "ecokv/error.h"
#include "ecokv/eval-runner.h"
#include "ecokv/llama-eval.h"
#include "ecokv/llama-options.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace {

using ecokv::error;
namespace el = ecokv::llama;

std::pair<int32_t, int32_t> parse_shard(const std::string & s) {
    const size_t slash = s.find('/');
    try {
        const int i = std::stoi(s.substr(0, slash)), n = std::stoi(s.substr(slash + 1));
        if (slash != std::string::npos && n >= 1 && i >= 0 && i < n) {
            return { i, n };
        }
    } catch (const std::exception &) {
    }
    throw error("--shard '" + s + "' must be i/n with 0 <= i < n");
}

std::vector<int32_t> parse_budgets(const std::string & s) {
    std::vector<int32_t> out;
    for (const std::string & b : ecokv::tools::split_list(s)) {
        size_t used = 0;
        try {
            out.push_back(std::stoi(b, &used));
        } catch (const std::exception &) {
        }
        if (used == 0 || used != b.size()) {
            throw error("--budgets: '" + b + "' is not an integer in [" + std::to_string(INT32_MIN) + ", " +
                        std::to_string(INT32_MAX) + "]");
        }
    }
    return out;
}

// On a terminal one line redrawn in place; otherwise (a log) one line per 5% of the items, and the last.
ecokv::eval_progress progress_printer() {
    const auto t0       = std::chrono::steady_clock::now();
    const bool terminal = isatty(fileno(stderr)) != 0;
    return [t0, terminal, last = size_t(-1)](size_t done, size_t total) mutable {
        const size_t step = total ? 20 * done / total : 20;
        if (!terminal && step == last && done != total) {
            return;
        }
        last = step;
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double eta     = done ? elapsed / double(done) * double(total - done) : 0.0;
        std::fprintf(stderr, "%s[eval] %zu/%zu items (%3.0f%%), elapsed %.0fs, ETA %.0fs%s", terminal ? "\r" : "", done,
                     total, total ? 100.0 * double(done) / double(total) : 100.0, elapsed, eta, terminal ? "   " : "\n");
        std::fflush(stderr);
    };
}

}  // namespace

int ecokv_eval(int argc, char ** argv) {
    return ecokv::tools::run_command("eval", [&] {
        cxxopts::Options options("ecokv eval", "Run a dataset through llama.cpp for every method and budget.");
        // clang-format off
        options.add_options()
            ("model", "GGUF model", cxxopts::value<std::string>())
            ("mmproj", "multimodal projector GGUF (for datasets with images)", cxxopts::value<std::string>())
            ("dataset", "dataset name (see --list-datasets)", cxxopts::value<std::string>())
            ("metric", "score with this metric instead of the dataset's (see ecokv metric --list)", cxxopts::value<std::string>())
            ("data", "directory holding the dataset's official files", cxxopts::value<std::string>()->default_value(""))
            ("methods", "comma-separated methods; `full` is the uncompressed cache", cxxopts::value<std::string>())
            ("budgets", "comma-separated budgets", cxxopts::value<std::string>()->default_value("64,128,256"))
            ("mode", "prompt: question inside the compressed prompt (the papers); agnostic: compress the context, then ask",
                cxxopts::value<std::string>()->default_value("prompt"))
            ("turns", "multi-turn: consecutive items about one context are one conversation, asked in order after the "
                      "context is compressed (agnostic mode; docs/conversations.md)")
            ("limit", "only the first N items", cxxopts::value<int32_t>()->default_value("0"))
            ("shard", "i/n: this process runs items i, i+n, i+2n, ...", cxxopts::value<std::string>()->default_value("0/1"))
            ("n,n-predict", "answer tokens", cxxopts::value<int32_t>()->default_value("16"))
            ("out", "results directory", cxxopts::value<std::string>())
            ("strict", "stop at an item that cannot be processed (default: record it as failed and go on)")
            ("list-datasets", "list the datasets and exit")
            ("verbose", "show llama.cpp's log")
            ("h,help", "show this help");
        // clang-format on
        // --methods and --budgets are lists of the table's method and budget; --image-max-tokens N is the
        // smaller-image baseline, reported by ecokv report in budget N's column.
        ecokv::tools::add_compression_options(options, ecokv::scope_method | ecokv::scope_prefill | ecokv::scope_decode |
                                                           ecokv::scope_turns, {},
                                              { "method", "budget" });
        ecokv::tools::add_engine_options(options);
        const auto parsed = ecokv::tools::parse_engine_command(options, argc, argv);
        if (!parsed) {
            return 0;
        }
        const cxxopts::ParseResult & args = *parsed;
        if (args.count("list-datasets")) {
            for (const auto & d : ecokv::list_datasets()) {
                std::printf("%-10s %-9s %s\n", d.name.c_str(), d.metric.c_str(), d.description.c_str());
            }
            return 0;
        }
        ecokv::tools::require(args, { "model", "dataset", "methods", "out" });
        const std::string mode = args["mode"].as<std::string>();
        if (mode != "prompt" && mode != "agnostic") {
            throw error("--mode must be prompt or agnostic, not '" + mode + "'");
        }
        ecokv::eval_options o;
        o.dataset                   = args["dataset"].as<std::string>();
        o.data_dir                  = args["data"].as<std::string>();
        o.metric                    = args.count("metric") ? args["metric"].as<std::string>() : "";
        o.turns                     = args.count("turns") > 0;
        // --turns asks after the context is compressed: agnostic unless a mode was named (which plan_eval checks)
        o.mode = mode == "agnostic" || (o.turns && !args.count("mode")) ? ecokv::eval_mode::agnostic
                                                                          : ecokv::eval_mode::prompt;
        o.methods                   = ecokv::tools::split_list(args["methods"].as<std::string>());
        o.budgets                   = parse_budgets(args["budgets"].as<std::string>());
        o.settings                  = ecokv::tools::compression_from(args);
        o.limit                     = ecokv::tools::int_in_range(args, "limit", 0, INT32_MAX);
        std::tie(o.shard, o.n_shards) = parse_shard(args["shard"].as<std::string>());
        o.n_predict                 = args["n-predict"].as<int32_t>();
        o.out_dir                   = args["out"].as<std::string>();
        o.model                     = args["model"].as<std::string>();
        o.projector                 = args.count("mmproj") ? args["mmproj"].as<std::string>() : "";
        o.strict                    = args.count("strict") > 0;
        el::session_options so      = ecokv::tools::engine_options_from(args);
        so.model_path               = o.model;
        so.mmproj_path              = o.projector;
        o.engine                    = el::recorded_engine_options(so);
        const ecokv::eval_plan plan = ecokv::plan_eval(o);  // every check before the model loads

        el::set_verbose(args.count("verbose") > 0);
        const el::session s(so);
        ecokv::run_eval(plan, *el::make_eval_engine(s), progress_printer());
        std::fprintf(stderr, "[eval] results in %s\n", plan.results_path.c_str());
        return 0;
    });
}
