// ecokv run: prefill a prompt in llama.cpp, compress the KV cache with any method, decode from the smaller
// cache, and report memory, time and (with --compare-full) agreement with the full cache. Without options it runs
// the README's main job (run/main-job.h).
#include "common/engine-flags.h"
#include "common/json-text.h"
#include "common/prompt-options.h"
#include "run/main-job.h"
#include "ecokv/capture.h"
#include "ecokv/error.h"
#include "ecokv/llama-session.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <optional>

namespace {

using ecokv::error;
using ecokv::tools::json_text;
using json   = nlohmann::json;
namespace el = ecokv::llama;

struct run_options {
    ecokv::tools::prompt_options prompt;
    ecokv::compression           c;
    int32_t                      n_predict    = 32;
    bool                         compare_full = false;
    bool                         json         = false;
    bool                         budget_given = false;  // the main job compresses to 100 entries unless told
    bool                         method_given = false;  // and compares SnapKV and SnapKV + ECOKV unless told
    std::string                  dump_capture;
};

// Fills o from the options; returns false after printing --help.
bool parse(int argc, char ** argv, run_options & o) {
    cxxopts::Options options("ecokv run", "Prefill, compress the KV cache, decode from the compressed cache. Without "
                                          "options: the README's main job, the bundled tiny-qwen2vl asked its sample "
                                          "page's questions with the full cache, SnapKV, SnapKV + ECOKV (budget 100) and "
                                          "a smaller image.");
    ecokv::tools::add_prompt_options(
        options, "question-agnostic mode: compress after the prompt, then answer each question (repeatable)");
    // clang-format off
    options.add_options()
        ("n,n-predict", "tokens to generate", cxxopts::value<int32_t>()->default_value("32"))
        ("compare-full", "also decode with the full cache: greedy agreement and mean KL")
        ("dump-capture", "write the prefill capture (SPEC §7) to this file", cxxopts::value<std::string>())
        ("json", "print one JSON object")
        ("h,help", "show this help");
    // clang-format on
    ecokv::tools::add_compression_options(options, ecokv::scope_method | ecokv::scope_prefill | ecokv::scope_decode);
    const auto parsed = ecokv::tools::parse_engine_command(options, argc, argv);
    if (!parsed) {
        return false;
    }
    const cxxopts::ParseResult & args = *parsed;
    o.prompt = ecokv::tools::prompt_options_from(args);
    // --method full: the whole cache, as the smaller image's baseline (--image-max-tokens) is run.
    const bool full_cache = args.count("method") && ecokv::is_full_cache(args["method"].as<std::string>());
    o.c = full_cache ? ecokv::compression::none() : ecokv::tools::compression_from(args);
    if (full_cache && args.count("budget")) {
        ecokv::set_option(o.c, "budget", args["budget"].as<std::string>());  // the main job's smaller image's size
    }
    o.c.validate();
    o.n_predict = args["n-predict"].as<int32_t>();
    if (o.n_predict < 1 || o.n_predict > 1000000) {
        throw error("-n " + std::to_string(o.n_predict) + " must lie in [1, 1000000]");
    }
    o.compare_full = args.count("compare-full") > 0;
    if (args.count("decode-compress") && (full_cache || o.prompt.main_job || o.prompt.questions.size() > 1)) {
        throw error("--decode-compress re-compresses one answer of a compressed cache: give a method and at most one "
                    "--question (each re-compression replaces the cache the next question would start from)");
    }
    o.budget_given = args.count("budget") > 0;
    o.method_given = args.count("method") > 0;
    o.json         = args.count("json") > 0;
    o.dump_capture = args.count("dump-capture") ? args["dump-capture"].as<std::string>() : "";
    if (o.c.chunk > 0 && !o.dump_capture.empty()) {
        throw error("--dump-capture writes the capture of a one-shot prefill; a chunked prefill (--chunk) has none");
    }
    for (const char * flag : { "compare-full", "chunk", "dump-capture" }) {
        if (full_cache && args.count(flag)) {
            throw error(std::string("--") + flag + " needs a compression; --method full keeps the whole cache");
        }
    }
    return true;
}

// One question: the compressed cache's answer and, with --compare-full, the full cache's answer and the compressed
// cache's fidelity to it. Each cache is rewound to its state after the prompt first.
struct answered {
    json                j;
    el::generation      gen;
    el::fidelity_report fidelity;
};

// With --decode-compress the answer re-compresses as it goes: the full cache's answer is shown beside it, with no
// teacher-forced fidelity (the compressed cache of each step depends on its own earlier tokens).
answered answer(const el::session & s, el::sequence & comp, el::sequence * full,
                const std::vector<llama_token> & question, const run_options & o) {
    answered a;
    comp.rewind();
    a.gen = comp.answer(question, o.n_predict);  // compressing again as it goes with --decode-compress
    a.j = { { "text", s.detokenize(a.gen.tokens) } };
    if (full != nullptr) {
        full->rewind();
        const el::reference ref = { full->answer(question, o.n_predict, true), {} };
        if (o.c.decode_compress == 0) {
            comp.rewind();
            a.fidelity = comp.fidelity(question, ref);
        }
        a.j["full_text"]   = s.detokenize(ref.answer.tokens);
        a.j["agreement"]   = a.fidelity.n ? json(a.fidelity.agreement) : json(nullptr);
        a.j["mean_kl"]     = a.fidelity.n ? json(a.fidelity.mean_kl) : json(nullptr);
    }
    return a;
}

json run(const run_options & o) {
    const el::session      s(o.prompt.session);
    const el::prompt_parts parts = o.prompt.questions.empty() ? el::prompt_parts{ s.chat_prompt(o.prompt.text), "" }
                                                              : s.split_prompt(o.prompt.text);
    std::vector<std::vector<llama_token>> questions;
    int32_t                               n_question_max = 0;
    for (const std::string & q : o.prompt.questions) {
        questions.push_back(s.tokenize(q + parts.question_suffix, false));
        n_question_max = std::max(n_question_max, int32_t(questions.back().size()));
    }
    if (questions.empty()) {
        questions.emplace_back();  // one answer to the prompt itself
    }
    const int32_t n_extra = o.n_predict + n_question_max;

    const el::prompt            p = s.make_prompt(parts.context, o.prompt.images);
    std::optional<el::sequence> full, compressed;
    json                        out = { { "model", s.description() },
                                        { "budget", o.c.enabled ? json(o.c.params.budget) : json(nullptr) },
                                        { "room_tokens", n_extra },   { "chunk", o.c.chunk } };
    if (o.c.enabled) {
        el::check_prompt_window(p.n_cells(), o.c);  // nothing to compress is a usage error here
    }
    if (o.compare_full || !o.dump_capture.empty()) {
        // The full cache first, as the reference or for its capture; compressed from it where the compression can be
        // (one prefill), else by a prefill of its own.
        ecokv::method_requirements needs = o.c.enabled ? ecokv::requirements(o.c.spec, o.c.params)
                                                       : ecokv::method_requirements{};
        needs.values |= !o.dump_capture.empty();  // a capture file holds them
        full.emplace(s.prefill(p, n_extra, needs));
        if (!o.dump_capture.empty()) {
            ecokv::write_capture(o.dump_capture, full->capture());
        }
        if (o.c.chunk == 0) {
            out["kv_bytes_full"] = full->kv_bytes_allocated();
        }
        out["prefill_s"] = full->prefill_seconds();
        if (!o.c.enabled) {  // --method full: answered from the prefill's own cache
            compressed.emplace(std::move(*full));
            full.reset();
        } else if (el::compressible_by_copy(o.c)) {
            compressed.emplace(full->compress(o.c.spec, o.c.params, n_extra));
            full->release_capture();
        } else {
            compressed.emplace(s.prefill(p, o.c, n_extra));
            out["prefill_s"] = compressed->prefill_seconds();
        }
        if (!o.compare_full) {
            full.reset();
        }
    } else {
        compressed.emplace(s.prefill(p, o.c, n_extra));
        out["prefill_s"] = compressed->prefill_seconds();
        if (o.c.chunk == 0) {
            out["kv_bytes_full"] = compressed->kv_bytes_prefilled();
        }
    }
    out["prompt_tokens"]   = p.n_cells();
    out["image_tokens"]    = p.n_media();
    out["kv_bytes_prompt"] = compressed->kv_bytes_of_cells(p.n_cells());
    el::sequence & comp        = *compressed;
    const auto &   ci          = comp.compression();
    out["method"]              = ci.sel.method.empty() ? o.c.name() : ci.sel.method;  // kept whole within the budget
    out["window"]              = ci.sel.window;
    out["kv_bytes_compressed"] = comp.kv_bytes_allocated();
    out["kv_bytes_kept"]       = comp.kv_bytes_kept();
    out["cells_per_head"]      = comp.n_cells();
    out["compress_s"]          = ci.capture_seconds + ci.select_seconds + ci.rebuild_seconds;
    out["capture_s"]           = ci.capture_seconds;
    out["select_s"]            = ci.select_seconds;
    out["rebuild_s"]           = ci.rebuild_seconds;
    out["bytes_to_host"]       = ci.bytes_to_host;

    json    answers  = json::array();
    double  decode_s = 0, agreement = 0, mean_kl = 0;
    int64_t n_decoded = 0, n_compared = 0;
    for (size_t qi = 0; qi < questions.size(); ++qi) {
        answered a = answer(s, comp, full ? &*full : nullptr, questions[qi], o);
        decode_s += a.gen.seconds;
        n_decoded += int64_t(a.gen.tokens.size());
        agreement += a.fidelity.agreement * a.fidelity.n;
        mean_kl += a.fidelity.mean_kl * a.fidelity.n;
        n_compared += a.fidelity.n;
        if (!o.prompt.questions.empty()) {
            a.j["question"] = o.prompt.questions[qi];
        }
        answers.push_back(a.j);
    }
    // After the answers: a re-compressing answer (--decode-compress) moved the peak and what the cache keeps.
    out["peak_kv_cells"]       = comp.peak_kv_cells();
    out["peak_kv_bytes"]       = comp.peak_kv_bytes();
    out["decode_compress"]     = o.c.decode_compress;
    out["cells_held_end"]      = comp.n_held();  // the longest head: kept entries and the cells decoded since
    out["compress_s_end"]      = comp.compression().select_seconds + comp.compression().rebuild_seconds +
                            comp.compression().capture_seconds;
    out["text"]                = answers[0]["text"];
    out["answers"]             = answers;
    out["decode_s"]            = decode_s;
    out["decode_tokens_per_s"] = decode_s > 0 ? double(n_decoded) / decode_s : 0.0;
    out["agreement"]           = n_compared ? json(agreement / double(n_compared)) : json(nullptr);
    out["mean_kl"]             = n_compared ? json(mean_kl / double(n_compared)) : json(nullptr);
    out["compared_tokens"]     = n_compared;
    return out;
}

// The main job's caches: the methods asked for (SnapKV and SnapKV + ECOKV) at the budget (100: a fifth of the page).
json run_main_job(run_options & o) {
    if (!o.budget_given) {
        o.c.params.budget = 100;
        o.c.validate();
    }
    std::vector<ecokv::tools::main_job_cache> caches;
    if (!o.c.enabled) {  // --method full: the full cache and the smaller image at the budget
    } else if (o.method_given) {
        caches.push_back({ o.c.name(), o.c });
    } else {
        for (const char * m : { "snapkv", "snapkv+ecokv" }) {
            caches.push_back({ m, ecokv::compression_named(m, o.c) });
        }
    }
    return ecokv::tools::main_job(o.prompt, caches, o.c.params.budget, o.n_predict);
}

void print_text(const json & out) {
    for (const auto & a : out["answers"]) {
        if (a.contains("question")) {
            std::printf("Q: %s\n", a["question"].get<std::string>().c_str());
        }
        std::printf("%s\n", a["text"].get<std::string>().c_str());
        if (a.contains("full_text") && a.contains("question")) {  // short answers: show both
            std::printf("(full cache: %s)\n", a["full_text"].get<std::string>().c_str());
        }
    }
    const double   mib       = 1048576.0;
    const int32_t  n_prompt  = out["prompt_tokens"], n_media = out["image_tokens"];
    const uint64_t kv_prompt = out["kv_bytes_prompt"], kv_kept = out["kv_bytes_kept"];
    if (out["budget"].is_null()) {
        std::printf("\nmethod    full (no compression)\n");
    } else {
        std::printf("\nmethod    %s (budget %d, window %d)\n", out["method"].get<std::string>().c_str(),
                    out["budget"].get<int>(), out["window"].get<int>());
    }
    std::printf("prompt    %d tokens (text %d, image %d)\n", n_prompt, n_prompt - n_media, n_media);
    // Entries are what a method keeps; allocated is the cache itself: a full context rounds up to 256 cells, the
    // compressed cache holds the kept entries plus room for the question and the answer.
    std::printf("kv cache  prompt entries %.3f MiB -> kept %.3f MiB (%.0f%% saved)\n", kv_prompt / mib, kv_kept / mib,
                100.0 * (1.0 - double(kv_kept) / double(std::max<uint64_t>(1, kv_prompt))));
    if (out["chunk"].get<int>() == 0) {
        std::printf("allocated full %.3f MiB -> compressed %.3f MiB (longest head %d entries, room for %d new tokens)\n",
                    out["kv_bytes_full"].get<uint64_t>() / mib, out["kv_bytes_compressed"].get<uint64_t>() / mib,
                    out["cells_per_head"].get<int>(), out["room_tokens"].get<int>());
    } else {
        std::printf("allocated chunks of %d cells -> compressed %.3f MiB (longest head %d entries, room for %d new tokens)\n",
                    out["chunk"].get<int>(), out["kv_bytes_compressed"].get<uint64_t>() / mib,
                    out["cells_per_head"].get<int>(), out["room_tokens"].get<int>());
    }
    std::printf("peak      %.3f MiB of KV cache, %d cells in one head at most\n",
                out["peak_kv_bytes"].get<uint64_t>() / mib, out["peak_kv_cells"].get<int>());
    std::printf("time      prefill %.3f s, compress %.4f s (select %.4f, rebuild %.4f), decode %.3f s (%.1f tok/s)\n",
                out["prefill_s"].get<double>(), out["compress_s"].get<double>(), out["select_s"].get<double>(),
                out["rebuild_s"].get<double>(), out["decode_s"].get<double>(), out["decode_tokens_per_s"].get<double>());
    if (out["decode_compress"].get<int>() > 0) {
        std::printf("answer    compressed again every %d cells: at the end the longest head holds %d entries; "
                    "compressions %.4f s in all\n",
                    out["decode_compress"].get<int>(), out["cells_held_end"].get<int>(),
                    out["compress_s_end"].get<double>());
    }
    if (out["compared_tokens"].get<int64_t>() > 0) {
        std::printf("vs full   agreement %.3f over %lld tokens, mean KL %.4f\n", out["agreement"].get<double>(),
                    (long long) out["compared_tokens"].get<int64_t>(), out["mean_kl"].get<double>());
    }
}

}  // namespace

int ecokv_run(int argc, char ** argv) {
    return ecokv::tools::run_command("run", [&] {
        run_options o;
        if (!parse(argc, argv, o)) {
            return 0;
        }
        const json out = o.prompt.main_job ? run_main_job(o) : run(o);
        if (o.json) {
            std::printf("%s\n", json_text(out).c_str());
        } else if (o.prompt.main_job) {
            ecokv::tools::print_main_job(out);
        } else {
            print_text(out);
        }
        return 0;
    });
}
