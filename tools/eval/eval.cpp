// ecokv eval: every item of a dataset once per (method, budget) through llama.cpp, one prefill per item,
// results appended to JSONL as they come, so a killed run resumes where it stopped; --shard splits the items.
#include "common/args.h"
#include "common/session.h"
#include "ecokv/datasets.h"
#include "ecokv/error.h"
#include "ecokv/llama-adapter.h"
#include "ecokv/llama-generate.h"
#include "ecokv/metrics.h"
#include "ecokv/safetensors.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace {

using ecokv::error;
using json   = nlohmann::json;
namespace el = ecokv::llama;
namespace fs = std::filesystem;
using namespace ecokv::tools;

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

std::string key(const std::string & id, const std::string & method, int32_t budget) {
    return id + "\x1f" + method + "\x1f" + std::to_string(budget);
}

// Reads the results already written (resume) and cuts a last line left half-written by a killed run.
std::set<std::string> load_done(const std::string & path) {
    std::set<std::string> done;
    std::ifstream         in(path);
    std::string           line;
    std::streamoff        good_end = 0;
    while (std::getline(in, line)) {
        try {
            const json j = json::parse(line);
            done.insert(key(j.at("id"), j.at("method"), j.at("budget")));
            good_end = in.tellg();
        } catch (const std::exception &) {
            break;
        }
    }
    in.close();
    if (fs::exists(path) && std::streamoff(fs::file_size(path)) != good_end && good_end >= 0) {
        fs::resize_file(path, uintmax_t(good_end));
    }
    return done;
}

// "metric \"anls\" there, \"chars\" here" for each key a results directory's config.json and this run disagree on.
std::string config_differences(const json & there, const json & here) {
    std::string out;
    json        keys = here;
    keys.update(there);  // every key of either
    for (const auto & [k, v] : keys.items()) {
        const json a = there.contains(k) ? there.at(k) : json(), b = here.contains(k) ? here.at(k) : json();
        if (a != b) {
            out += (out.empty() ? "" : ", ") + k + " " + a.dump() + " there, " + b.dump() + " here";
        }
    }
    return out;
}

// The answer: the first line of the output, trimmed; the whole output for transcriptions (`chars`), which span
// lines.
std::string answer_text(std::string s, bool whole_output) {
    if (!whole_output) {
        s = s.substr(0, s.find('\n'));
    }
    const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Per layer, the mean over decode steps of ||o_compressed - o_full|| / ||o_full|| of the attention output of the
// token decoded at that step (teacher-forced, so both caches see the same tokens). Null without steps.
json attention_error(const std::vector<std::vector<std::vector<float>>> & full,
                     const std::vector<std::vector<std::vector<float>>> & comp) {
    const size_t n_steps = std::min(full.size(), comp.size());
    if (n_steps == 0 || full[0].empty()) {
        return nullptr;
    }
    std::vector<double> err(full[0].size(), 0.0);
    for (size_t s = 0; s < n_steps; ++s) {
        for (size_t il = 0; il < err.size(); ++il) {
            const std::vector<float> &f = full[s][il], &c = comp[s][il];
            double diff = 0, norm = 0;
            for (size_t i = 0; i < f.size() && i < c.size(); ++i) {
                diff += (double(c[i]) - f[i]) * (double(c[i]) - f[i]);
                norm += double(f[i]) * f[i];
            }
            err[il] += norm > 0 ? std::sqrt(diff / norm) / double(n_steps) : 0.0;
        }
    }
    return err;
}

void progress(size_t done, size_t total, double elapsed) {
    const double eta = done ? elapsed / double(done) * double(total - done) : 0.0;
    std::fprintf(stderr, "\r[eval] %zu/%zu items (%3.0f%%), elapsed %.0fs, ETA %.0fs   ", done, total,
                 total ? 100.0 * double(done) / double(total) : 100.0, elapsed, eta);
    std::fflush(stderr);
}

}  // namespace

int ecokv_eval(int argc, char ** argv) {
    return run_command("eval", [&] {
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
            ("limit", "only the first N items", cxxopts::value<int32_t>()->default_value("0"))
            ("shard", "i/n: this process runs items i, i+n, i+2n, ...", cxxopts::value<std::string>()->default_value("0/1"))
            ("n,n-predict", "answer tokens", cxxopts::value<int32_t>()->default_value("16"))
            ("t,threads", "CPU threads", cxxopts::value<int32_t>()->default_value("0"))
            ("out", "results directory", cxxopts::value<std::string>())
            ("list-datasets", "list the datasets and exit")
            ("verbose", "show llama.cpp's log")
            ("h,help", "show this help");
        // clang-format on
        add_method_options(options);
        const auto args = options.parse(argc, argv);
        if (args.count("help")) {
            std::printf("%s\n", options.help({ "", "method" }).c_str());
            return 0;
        }
        if (args.count("list-datasets")) {
            for (const auto & d : ecokv::list_datasets()) {
                std::printf("%-10s %-9s %s\n", d.name.c_str(), d.metric.c_str(), d.description.c_str());
            }
            return 0;
        }
        reject_positional(args);
        require(args, { "model", "dataset", "methods", "out" });
        const ecokv::dataset_info & dataset = ecokv::find_dataset(args["dataset"].as<std::string>());
        // Checked now, before any work: an unknown name fails with the list of known ones.
        const ecokv::metric_info &  metric  = ecokv::find_metric(args.count("metric") ? args["metric"].as<std::string>()
                                                                                      : dataset.metric);
        const std::string           mode    = args["mode"].as<std::string>();
        if (mode != "prompt" && mode != "agnostic") {
            throw error("--mode must be prompt or agnostic, not '" + mode + "'");
        }
        std::vector<std::string> methods = split_list(args["methods"].as<std::string>());
        for (std::string & m : methods) {  // canonical names: results of "snapkv+mixkv" and "mixkv" merge
            m = m == "full" ? m : ecokv::parse_method(m).name();
        }
        std::vector<int32_t>           budgets;
        for (const std::string & b : split_list(args["budgets"].as<std::string>())) {
            budgets.push_back(std::stoi(b));
        }
        const ecokv::method_params base = method_params_from(args);
        for (const std::string & m : methods) {  // fail on a bad method or budget before any work
            if (m != "full") {
                for (int32_t b : budgets) {
                    ecokv::method_params p = base;
                    p.budget               = b;
                    p.validate(ecokv::method_window(ecokv::parse_method(m), p));
                }
            }
        }
        const auto [shard, n_shards] = parse_shard(args["shard"].as<std::string>());
        const int32_t n_predict      = args["n-predict"].as<int32_t>();
        const int32_t n_threads      = args["threads"].as<int32_t>();

        std::vector<ecokv::eval_item> items = ecokv::load_dataset(dataset.name, args["data"].as<std::string>());
        if (const int32_t limit = args["limit"].as<int32_t>(); limit > 0 && size_t(limit) < items.size()) {
            items.resize(size_t(limit));
        }
        for (const ecokv::eval_item & it : items) {  // else evaluate() would throw after the first answer
            if (metric.needs_type && it.type.empty()) {
                throw error("metric " + metric.name + " needs each item's question type; " + dataset.name + " item '" +
                            it.id + "' has none");
            }
        }
        std::vector<const ecokv::eval_item *> mine;
        for (size_t i = 0; i < items.size(); ++i) {
            if (int32_t(i % size_t(n_shards)) == shard) {
                mine.push_back(&items[i]);
            }
        }

        const std::string out_dir = args["out"].as<std::string>();
        fs::create_directories(out_dir);
        const json config = { { "dataset", dataset.name }, { "metric", metric.name }, { "mode", mode },
                              { "model", fs::path(args["model"].as<std::string>()).filename().string() },
                              { "n_predict", n_predict } };
        const std::string config_path = out_dir + "/config.json";
        if (fs::exists(config_path)) {
            std::ifstream in(config_path);
            if (const json there = json::parse(in); there != config) {
                throw error(config_path + " describes another run (" + config_differences(there, config) + ")");
            }
        } else {
            ecokv::write_file_atomic(config_path, config.dump(2) + "\n");
        }
        const std::string results = out_dir + "/results" +
                                    (n_shards > 1 ? ".shard-" + std::to_string(shard) + "-of-" + std::to_string(n_shards) : "") +
                                    ".jsonl";
        const std::set<std::string> done = load_done(results);
        std::ofstream               out(results, std::ios::app);

        set_llama_verbose(args.count("verbose") > 0);
        const model_ptr     model     = load_model(args["model"].as<std::string>());
        const projector_ptr projector = args.count("mmproj") ? load_projector(args["mmproj"].as<std::string>(), model.get(), n_threads)
                                                             : nullptr;
        bool needs_full_queries = false;
        for (const std::string & m : methods) {
            needs_full_queries = needs_full_queries || (m != "full" && ecokv::parse_method(m).scorer == "h2o");
        }

        const auto t_start = std::chrono::steady_clock::now();
        for (size_t k = 0; k < mine.size(); ++k) {
            const ecokv::eval_item & item = *mine[k];
            progress(k, mine.size(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
            std::vector<std::pair<std::string, int32_t>> todo;
            for (const std::string & m : methods) {
                for (int32_t b : m == "full" ? std::vector<int32_t>{ 0 } : budgets) {
                    if (!done.count(key(item.id, m, b))) {
                        todo.emplace_back(m, b);
                    }
                }
            }
            if (todo.empty()) {
                continue;
            }
            // One prefill per item; every method compresses from it.
            const std::string context = with_media_markers(item.context, item.images.size());
            prompt_parts      parts;
            if (mode == "prompt") {
                parts = { el::chat_prompt(model.get(), context.empty() ? item.question : context + "\n" + item.question), "" };
            } else {
                parts = split_prompt(model.get(), context);
            }
            const std::vector<llama_token> question =
                mode == "agnostic" ? el::tokenize(model.get(), item.question + parts.question_suffix, false)
                                   : std::vector<llama_token>{};
            const prompt         prompt(model.get(), projector.get(), parts.context, item.images);
            const int32_t        n_extra = n_predict + int32_t(question.size());
            const auto           cparams = context_params(prompt.n_cells() + n_extra, n_threads);
            el::query_capture    capture(model.get(), 32, needs_full_queries);
            llama_context_params pparams = cparams;
            capture.attach(pparams);
            el::context_ptr ctx(llama_init_from_model(model.get(), pparams));
            if (!ctx) {
                throw error("item " + item.id + ": cannot create a context of " + std::to_string(pparams.n_ctx) + " cells");
            }
            const prefill_result       pr = prompt.prefill(ctx.get());
            capture.set_active(false);
            const el::prefill_state    state(ctx.get(), capture, pr.modality);
            const std::vector<uint8_t> full_state = save_state(ctx.get());
            const uint64_t             kv_full    = el::kv_bytes_allocated(ctx.get(), state.kv_bytes_per_cell());

            // The full cache's greedy answer (with its distributions) is the reference of every method.
            restore_state(ctx.get(), full_state);
            std::vector<float> full_logits = pr.first_logits;
            const llama_pos    answer_pos  = pr.n_past + llama_pos(question.size());
            if (!question.empty()) {
                full_logits = el::decode(ctx.get(), question, pr.n_past);
            }
            using step_outputs = std::vector<std::vector<std::vector<float>>>;  // [step][layer][n_head * head_dim_v]
            step_outputs full_out;
            capture.set_probe(true);
            const el::generation full = el::greedy(ctx.get(), full_logits, answer_pos, n_predict, true,
                                                   [&] { full_out.push_back(capture.attention_outputs()); });
            capture.set_probe(false);

            for (const auto & [method, budget] : todo) {
                el::compressed_cache cc;
                json rec = { { "id", item.id }, { "method", method }, { "budget", budget }, { "type", item.type },
                             { "answers", item.answers }, { "prompt_tokens", pr.n_tokens }, { "image_tokens", pr.n_media },
                             { "kv_bytes_full", kv_full }, { "prefill_s", pr.seconds } };
                const el::generation * gen = &full;
                el::generation         own;
                if (method == "full") {
                    rec["kv_bytes_compressed"] = kv_full;
                    rec["compress_s"]          = 0.0;
                } else {
                    ecokv::method_params p = base;
                    p.budget               = budget;
                    el::query_capture          probe(model.get(), 1, false);
                    probe.set_active(false);
                    const el::compressed_cache cc =
                        el::compress_context(model.get(), state, ecokv::parse_method(method), p, n_extra, cparams, &probe);
                    rec["kv_bytes_compressed"] = cc.kv_bytes_alloc;
                    rec["compress_s"]          = cc.select_seconds + cc.rebuild_seconds;
                    const std::vector<float> first =
                        question.empty() ? pr.first_logits : el::decode(cc.ctx.get(), question, pr.n_past);
                    own = el::greedy(cc.ctx.get(), first, answer_pos, n_predict, false);
                    gen = &own;
                    // Fidelity without gold answers: teacher-forced on the full cache's answer.
                    restore_state(cc.ctx.get(), cc.state);
                    if (!question.empty()) {
                        el::decode(cc.ctx.get(), question, pr.n_past);
                    }
                    step_outputs comp_out;
                    probe.set_probe(true);
                    const el::fidelity fid =
                        el::compare_to_full(cc.ctx.get(), full, answer_pos, question.empty() ? nullptr : &first,
                                            [&] { comp_out.push_back(probe.attention_outputs()); });
                    rec["agreement"]      = fid.n ? json(fid.agreement) : json(nullptr);
                    rec["mean_kl"]        = fid.n ? json(fid.mean_kl) : json(nullptr);
                    rec["attn_rel_error"] = attention_error(full_out, comp_out);
                }
                rec["prediction"] = answer_text(el::detokenize(model.get(), gen->tokens), metric.name == "chars");
                rec["decode_s"]   = gen->seconds;
                // The item's own score; CIDEr is corpus-level (document frequencies), so only the report has it.
                if (metric.name != "cider") {
                    const ecokv::metric_item mi{ rec["prediction"], item.answers, item.type };
                    rec["score"] = ecokv::evaluate(metric.name, std::span(&mi, 1)).score;
                } else {
                    rec["score"] = nullptr;
                }
                out << rec.dump() << "\n";
                out.flush();  // a killed run loses nothing that was answered
            }
        }
        progress(mine.size(), mine.size(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
        std::fprintf(stderr, "\n[eval] results in %s\n", results.c_str());
        return 0;
    });
}
