// ecokv report: merge the results of `ecokv eval` runs (shards, resumed runs) into a table shaped like the
// papers' Table 1: methods x budgets with the run's metric, FullKV first, deltas against a baseline method
// (--baseline, MixKV by default as in the ECOKV paper). Where the metric scores items one by one, each score has its
// standard error and each delta is the paired difference over the items both methods answered, with its own
// standard error (the items are shared, so the paired error is the one that says whether a delta is noise).
#include "common/args.h"
#include "ecokv/error.h"
#include "ecokv/method.h"
#include "ecokv/metrics.h"
#include "ecokv/options.h"
#include "ecokv/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace {

using ecokv::error;
using json   = nlohmann::json;
namespace fs = std::filesystem;

struct cell_key {
    std::string method;
    int32_t     budget;
    bool operator<(const cell_key & o) const { return std::tie(method, budget) < std::tie(o.method, o.budget); }
};

struct fidelity_sum {
    double agreement = 0, kl = 0, attn = 0;
    size_t n         = 0;
};

struct item_fidelity {
    double agreement = 0, kl = 0, attn = 0;  // attn: mean over layers of the relative attention-output error
};

struct dataset_results {
    std::string                                                      metric;
    std::map<cell_key, std::map<std::string, item_fidelity>> fidelity;  // id -> fidelity
    std::map<cell_key, std::map<std::string, ecokv::metric_item>>    items;  // (method, budget) -> id -> item
    std::map<cell_key, std::map<std::string, std::string>>           failed;  // (method, budget) -> id -> why
    std::vector<std::string>                                         method_order;
};

constexpr const char * k_smaller_image = "FullKV, smaller image";

// " [window 32, mixkv_scale importance]": the values of the --tag keys a directory's config.json sets, so that one
// method run with different settings in different directories makes different rows ("" when it sets none).
std::string tag_suffix(const json & cfg, const std::vector<std::string> & tags) {
    std::string out;
    for (const std::string & k : tags) {
        if (cfg.contains(k) && !cfg[k].is_null()) {
            out += (out.empty() ? "" : ", ") + k + " " + (cfg[k].is_string() ? cfg[k].get<std::string>() : cfg[k].dump());
        }
    }
    return out.empty() ? out : " [" + out + "]";
}

// The tags that change what the full cache computes: config keys that are not compression options (the engine's,
// such as cache_type_k). FullKV rows are told apart by these only.
std::vector<std::string> full_cache_tags(const std::vector<std::string> & tags) {
    const auto               rows = ecokv::compression_options();
    std::vector<std::string> out;
    for (const std::string & k : tags) {
        if (std::none_of(rows.begin(), rows.end(), [&](const ecokv::option_info & o) { return o.key == k; })) {
            out.push_back(k);
        }
    }
    return out;
}

// A FullKV row: "full", or "full [cache_type_k q8_0]".
bool full_row(const std::string & method) { return ecokv::is_full_cache(method.substr(0, method.find(" ["))); }

void read_dir(const std::string & dir, const std::vector<std::string> & tags,
              std::map<std::string, dataset_results> & out) {
    std::ifstream cfg_in(dir + "/config.json");
    if (!cfg_in) {
        throw error(dir + ": no config.json (not an ecokv eval results directory)");
    }
    json cfg;
    try {
        cfg = json::parse(cfg_in);
    } catch (const json::exception & e) {
        throw error(dir + "/config.json: not an ecokv eval config (" + e.what() + ")");
    }
    const std::string dataset = cfg.at("dataset").get<std::string>();
    const std::string metric  = cfg.at("metric").get<std::string>();  // the dataset's, or eval --metric's
    dataset_results & results = out[dataset];
    if (!results.metric.empty() && results.metric != metric) {  // one table has one metric
        throw error(dir + ": " + dataset + " scored with " + metric + ", but with " + results.metric +
                    " in an earlier directory (report them separately)");
    }
    results.metric           = metric;
    const std::string suffix = tag_suffix(cfg, tags), full_suffix = tag_suffix(cfg, full_cache_tags(tags));
    // The full cache of images resized to at most N tokens (eval --image-max-tokens N) is the smaller-image
    // baseline: a row of its own, in budget N's column.
    const int32_t image_max_tokens = cfg.value("image_max_tokens", 0);
    std::vector<fs::path> files;
    for (const auto & e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("results", 0) == 0 && e.path().extension() == ".jsonl") {
            files.push_back(e.path());
        }
    }
    std::sort(files.begin(), files.end());
    for (const fs::path & f : files) {
        std::ifstream in(f);
        std::string   line;
        for (int n = 1; std::getline(in, line); ++n) {
            json j;
            try {
                j = json::parse(line);
            } catch (const json::exception & e) {
                if (in.peek() == std::ifstream::traits_type::eof()) {
                    break;  // a half-written last line of a killed run (the next resume cuts it)
                }
                throw error(f.string() + ":" + std::to_string(n) + ": not a results record (" + e.what() + ")");
            }
            const bool full          = ecokv::is_full_cache(j.at("method").get<std::string>());
            const bool smaller_image = image_max_tokens > 0 && full;
            const std::string method = smaller_image ? std::string(k_smaller_image)
                                       : full        ? std::string(ecokv::k_full_cache) + full_suffix
                                                     : j.at("method").get<std::string>() + suffix;
            if (smaller_image) {
                j["budget"] = image_max_tokens;
            }
            if (j.contains("error")) {  // an item eval could not process
                results.failed[{ method, j.at("budget").get<int32_t>() }][j.at("id").get<std::string>()] = j["error"];
                if (std::find(results.method_order.begin(), results.method_order.end(), method) ==
                    results.method_order.end()) {
                    results.method_order.push_back(method);
                }
                continue;
            }
            if (std::find(results.method_order.begin(), results.method_order.end(), method) == results.method_order.end()) {
                results.method_order.push_back(method);
            }
            if (j.contains("agreement") && j["agreement"].is_number()) {
                double attn = 0;
                if (j.contains("attn_rel_error") && j["attn_rel_error"].is_array() && !j["attn_rel_error"].empty()) {
                    for (const json & e : j["attn_rel_error"]) {
                        attn += e.get<double>();
                    }
                    attn /= double(j["attn_rel_error"].size());
                }
                results.fidelity[{ method, j.at("budget").get<int32_t>() }][j.at("id").get<std::string>()] = {
                    j["agreement"].get<double>(), j["mean_kl"].get<double>(), attn
                };
            }
            results.items[{ method, j.at("budget").get<int32_t>() }][j.at("id").get<std::string>()] = {
                j.at("prediction").get<std::string>(), j.at("answers").get<std::vector<std::string>>(),
                j.value("type", std::string())
            };
        }
    }
}

// Mean and standard error of the mean (sample standard deviation / sqrt(n); 0 for fewer than 2 values).
struct mean_se {
    double mean = 0, se = 0;
    size_t n    = 0;
};

mean_se summarize(const std::vector<double> & v) {
    mean_se r;
    r.n = v.size();
    for (double x : v) {
        r.mean += x / double(v.size());
    }
    if (v.size() > 1) {
        double ss = 0;
        for (double x : v) {
            ss += (x - r.mean) * (x - r.mean);
        }
        r.se = std::sqrt(ss / double(v.size() - 1) / double(v.size()));
    }
    return r;
}

// Each item's score (x100) by id: the metric on that item alone, which the corpus score is the mean of; empty for a
// metric with only a corpus score (CIDEr).
std::map<std::string, double> item_scores(const std::string & metric,
                                          const std::map<std::string, ecokv::metric_item> & by_id) {
    std::map<std::string, double> out;
    if (ecokv::find_metric(metric).corpus_only) {
        return out;
    }
    for (const auto & [id, it] : by_id) {
        out[id] = 100.0 * ecokv::evaluate(metric, std::span<const ecokv::metric_item>(&it, 1)).score;
    }
    return out;
}

// The paired difference a - b over the ids both have.
mean_se paired(const std::map<std::string, double> & a, const std::map<std::string, double> & b) {
    std::vector<double> d;
    for (const auto & [id, x] : a) {
        if (const auto it = b.find(id); it != b.end()) {
            d.push_back(x - it->second);
        }
    }
    return summarize(d);
}

// "| method | 256 | 128 |" and its Markdown rule.
void table_header(std::ostringstream & md, const std::vector<int32_t> & budgets) {
    md << "| method |";
    for (int32_t b : budgets) {
        md << " " << (b > 0 ? std::to_string(b) : "score") << " |";
    }
    md << "\n|---|";
    for (size_t i = 0; i < budgets.size(); ++i) {
        md << "---:|";
    }
    md << "\n";
}

std::string label(const std::string & method) {
    return full_row(method) ? "FullKV" + method.substr(std::min(method.find(" ["), method.size())) : method;
}

// The canonical name of a --baseline value: "full" (FullKV) or a method (mixkv -> uniform+mixkv).
std::string baseline_method(const std::string & text) {
    if (full_row(text)) {
        return text;
    }
    const size_t tag = text.find(" [");  // a tagged row: "snapkv [window 32]"
    try {
        return ecokv::parse_method(text.substr(0, tag)).name() + (tag == std::string::npos ? "" : text.substr(tag));
    } catch (const error & e) {
        throw error("--baseline: " + std::string(e.what()));
    }
}

// The row the deltas are against: the baseline itself, else (with --tag) its first tagged row; "" when absent.
std::string resolve_baseline(const std::string & baseline, const std::vector<std::string> & order) {
    if (std::find(order.begin(), order.end(), baseline) != order.end()) {
        return baseline;
    }
    const auto tagged = std::find_if(order.begin(), order.end(),
                                     [&](const std::string & m) { return m.rfind(baseline + " [", 0) == 0; });
    return tagged == order.end() ? "" : *tagged;
}

// The CSV column of the deltas: delta_vs_mixkv for uniform+mixkv (a bare scorer), delta_vs_full, ...
std::string delta_column(const std::string & baseline) {
    const std::string uniform = "uniform+";
    return "delta_vs_" + (baseline.rfind(uniform, 0) == 0 ? baseline.substr(uniform.size()) : baseline);
}

// The three forms of the report, written side by side.
struct report {
    std::ostringstream md, csv;
    json               js = json::object();
};

// The compressed runs' budgets, largest first as in the papers (256, 128, 64).
std::vector<int32_t> budgets_of(const dataset_results & res) {
    std::vector<int32_t> budgets;
    for (const auto & [k, v] : res.items) {
        if (!full_row(k.method) && std::find(budgets.begin(), budgets.end(), k.budget) == budgets.end()) {
            budgets.push_back(k.budget);
        }
    }
    std::sort(budgets.rbegin(), budgets.rend());
    if (budgets.empty()) {
        budgets.push_back(0);  // a run of FullKV alone: one column, its score
    }
    return budgets;
}

// One cell of the table: the score (x100) over n items, its standard error, and the paired difference from the
// baseline's cell at the same budget when there is one.
struct cell_score {
    double  score = 0;
    size_t  n     = 0;
    mean_se own;
    bool    has_delta = false;
    double  delta     = 0;
    mean_se diff;
};

// The methods x budgets table of one dataset, FullKV first; the rows of the CSV and of the JSON.
void write_scores(const std::string & dataset, const dataset_results & res, const std::string & baseline,
                  const std::vector<int32_t> & budgets, report & out) {
    const std::string base_row    = resolve_baseline(baseline, res.method_order);
    const bool        with_errors = !ecokv::find_metric(res.metric).corpus_only;
    std::map<cell_key, std::pair<double, size_t>>     score;
    std::map<cell_key, std::map<std::string, double>> per_item;
    for (const auto & [k, by_id] : res.items) {
        std::vector<ecokv::metric_item> items;
        for (const auto & [id, it] : by_id) {
            items.push_back(it);
        }
        const ecokv::metric_result r = ecokv::evaluate(res.metric, items);
        score[k]                     = { 100.0 * r.score, r.n };
        per_item[k]                  = item_scores(res.metric, by_id);
    }
    const auto cell_at = [&](const std::string & m, int32_t b) {
        const cell_key k{ m, full_row(m) ? 0 : b };
        cell_score     c{ score[k].first, score[k].second, summarize([&] {
                             std::vector<double> v;
                             for (const auto & [id, x] : per_item[k]) {
                                 v.push_back(x);
                             }
                             return v;
                         }()) };
        const cell_key base{ base_row, full_row(base_row) ? 0 : b };
        if (m != base_row && !full_row(m) && score.count(base)) {
            c.has_delta = true;
            c.delta     = c.score - score[base].first;
            c.diff      = paired(per_item[k], per_item[base]);
        }
        return c;
    };
    out.md << "## " << dataset << " (" << res.metric << ", x100)\n\n";
    table_header(out.md, budgets);
    for (const std::string & m : res.method_order) {
        out.md << "| " << label(m) << " |";
        for (int32_t b : budgets) {
            if (!score.count({ m, full_row(m) ? 0 : b })) {
                out.md << " - |";
                continue;
            }
            const cell_score c = cell_at(m, b);
            char             buf[96];
            std::snprintf(buf, sizeof buf, with_errors ? " %.1f ±%.1f" : " %.1f", c.score, c.own.se);
            out.md << buf;
            if (c.has_delta) {
                std::snprintf(buf, sizeof buf, with_errors ? " (%+.1f ±%.1f)" : " (%+.1f)", c.delta, c.diff.se);
                out.md << buf;
            }
            out.md << " |";
            if (full_row(m) && b != budgets.front()) {
                continue;  // FullKV is one row of the CSV and JSON
            }
            const int32_t budget = full_row(m) ? 0 : b;
            out.csv << dataset << "," << res.metric << "," << label(m) << "," << budget << "," << c.score << ","
                    << c.n << "," << (with_errors ? std::to_string(c.own.se) : "") << ","
                    << (c.has_delta ? std::to_string(c.delta) : "") << ","
                    << (c.has_delta && with_errors ? std::to_string(c.diff.se) : "") << ","
                    << (c.has_delta && with_errors ? std::to_string(c.diff.n) : "") << "\n";
            json & table     = out.js[dataset];
            table["metric"]   = res.metric;
            table["baseline"] = label(base_row.empty() ? baseline : base_row);
            json row = { { "method", label(m) }, { "budget", budget }, { "score", c.score }, { "n", c.n } };
            if (with_errors) {
                row["se"] = c.own.se;
            }
            if (c.has_delta) {
                row["delta"] = c.delta;
                if (with_errors) {
                    row["delta_se"] = c.diff.se;
                    row["n_paired"] = c.diff.n;
                }
            }
            table["scores"].push_back(row);
        }
        out.md << "\n";
    }
    out.md << "\n";
}

// The items eval could not process: the scores are over the others.
void write_failed(const std::string & dataset, const dataset_results & res, report & out) {
    for (const auto & [k, by_id] : res.failed) {
        out.md << "Failed items, " << label(k.method) << (full_row(k.method) ? "" : " " + std::to_string(k.budget))
               << ": " << by_id.size() << " (first: " << by_id.begin()->first << ": " << by_id.begin()->second << ")\n";
        out.js[dataset]["failed"].push_back({ { "method", label(k.method) }, { "budget", k.budget },
                                              { "n", by_id.size() } });
    }
    if (!res.failed.empty()) {
        out.md << "\n";
    }
}

// How close each compressed cache stays to the full one (needs no gold answers).
void write_fidelity(const std::string & dataset, const dataset_results & res, const std::vector<int32_t> & budgets,
                    report & out) {
    if (res.fidelity.empty()) {
        return;
    }
    out.md << "Fidelity to FullKV, teacher-forced on FullKV's answer (greedy agreement / mean KL / relative "
              "error of the attention output, mean over layers):\n\n";
    table_header(out.md, budgets);
    for (const std::string & m : res.method_order) {
        if (full_row(m)) {
            continue;
        }
        out.md << "| " << label(m) << " |";
        for (int32_t b : budgets) {
            fidelity_sum f;
            if (const auto it = res.fidelity.find({ m, b }); it != res.fidelity.end()) {
                for (const auto & [id, v] : it->second) {
                    f.agreement += v.agreement;
                    f.kl += v.kl;
                    f.attn += v.attn;
                    ++f.n;
                }
            }
            const double n = double(f.n ? f.n : 1);
            char         buf[96];
            std::snprintf(buf, sizeof buf, f.n ? " %.3f / %.4f / %.3f |" : " - |", f.agreement / n, f.kl / n,
                          f.attn / n);
            out.md << buf;
            if (f.n) {
                out.js[dataset]["fidelity"].push_back({ { "method", label(m) }, { "budget", b },
                                                        { "agreement", f.agreement / n }, { "mean_kl", f.kl / n },
                                                        { "attn_rel_error", f.attn / n }, { "n", f.n } });
            }
        }
        out.md << "\n";
    }
    out.md << "\n";
}

}  // namespace

int ecokv_report(int argc, char ** argv) {
    return ecokv::tools::run_command("report", [&] {
        cxxopts::Options options("ecokv report", "Merge ecokv eval results into a methods x budgets table.");
        // clang-format off
        options.add_options()
            ("dirs", "results directories", cxxopts::value<std::vector<std::string>>())
            ("out", "write OUT.md, OUT.csv and OUT.json (default: report.* in the first directory)", cxxopts::value<std::string>())
            ("baseline", "the deltas are against this method (any method name, or full for FullKV; default uniform+mixkv)", cxxopts::value<std::string>())
            ("tag", "config.json keys that tell rows apart, e.g. window,mixkv_scale,ecokv_weights: a method run with "
                "other values in another directory is another row, labelled \"method [window 32]\"", cxxopts::value<std::string>())
            ("h,help", "show this help");
        // clang-format on
        options.parse_positional({ "dirs" });
        options.positional_help("DIR...");
        const auto args = options.parse(argc, argv);
        if (args.count("help")) {
            std::printf("%s\n", options.help().c_str());
            return 0;
        }
        ecokv::tools::require(args, { "dirs" });
        const auto dirs = args["dirs"].as<std::vector<std::string>>();
        const std::string baseline =
            baseline_method(args.count("baseline") ? args["baseline"].as<std::string>() : "uniform+mixkv");
        std::map<std::string, dataset_results> all;
        const std::vector<std::string> tags =
            args.count("tag") ? ecokv::tools::split_list(args["tag"].as<std::string>()) : std::vector<std::string>{};
        for (const std::string & d : dirs) {
            read_dir(d, tags, all);
        }
        // Without its baseline a table has no deltas; a baseline asked for by name must be somewhere.
        if (args.count("baseline") && std::none_of(all.begin(), all.end(), [&](const auto & d) {
                return !resolve_baseline(baseline, d.second.method_order).empty();
            })) {
            std::string known;
            for (const auto & [dataset, res] : all) {
                for (const std::string & m : res.method_order) {
                    known += (known.empty() ? "" : ", ") + m;
                }
            }
            throw error("--baseline " + baseline +
                        ": no results for it in the directories given; methods there: " + known);
        }
        report out;
        out.csv << "dataset,metric,method,budget,score,n,se," << delta_column(baseline) << ",delta_se,n_paired\n";
        for (auto & [dataset, res] : all) {
            std::stable_partition(res.method_order.begin(), res.method_order.end(),
                                  [](const std::string & m) { return full_row(m); });
            const std::vector<int32_t> budgets = budgets_of(res);
            write_scores(dataset, res, baseline, budgets, out);
            write_failed(dataset, res, out);
            write_fidelity(dataset, res, budgets, out);
        }
        std::fputs(out.md.str().c_str(), stdout);
        const std::string prefix = args.count("out") ? args["out"].as<std::string>() : dirs.front() + "/report";
        ecokv::write_files_atomic({ { prefix + ".md", out.md.str() },
                                    { prefix + ".csv", out.csv.str() },
                                    { prefix + ".json", out.js.dump(2) + "\n" } });
        return 0;
    });
}
