// ecokv run: prefill a prompt in llama.cpp, compress the KV cache with any method, decode from the smaller
// cache, and report memory, time and (with --compare-full) agreement with the full cache.
#include "common/args.h"
#include "common/session.h"
#include "ecokv/capture.h"
#include "ecokv/error.h"
#include "ecokv/llama-adapter.h"
#include "ecokv/llama-generate.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

using ecokv::error;
namespace el = ecokv::llama;
using namespace ecokv::tools;

// The bundled default model, from the source tree this binary was built from (models/tiny-vlm.md).
const std::string k_bundled_model  = ECOKV_MODELS_DIR "/tiny-vlm.gguf";
const std::string k_bundled_mmproj = ECOKV_MODELS_DIR "/tiny-vlm-mmproj.gguf";

std::string read_text(const std::string & path) {
    std::ifstream in(path);
    if (!in) {
        throw error(path + ": cannot open prompt file");
    }
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

}  // namespace

int ecokv_run(int argc, char ** argv) {
    return ecokv::tools::run_command("run", [&] {
        cxxopts::Options options("ecokv run", "Prefill, compress the KV cache, decode from the compressed cache.");
        // clang-format off
        options.add_options()
            ("model", "GGUF model (default: the bundled tiny VLM, models/tiny-vlm.gguf, with its mmproj)",
                cxxopts::value<std::string>())
            ("mmproj", "multimodal projector GGUF (libmtmd)", cxxopts::value<std::string>())
            ("image", "image file for the prompt (repeatable; placed where the prompt has <__media__>, else first)",
                cxxopts::value<std::vector<std::string>>())
            ("p,prompt", "prompt text (the context in question mode; may be left out with --image)",
                cxxopts::value<std::string>())
            ("f,file", "read the prompt from a file", cxxopts::value<std::string>())
            ("question", "question-agnostic mode: compress after the prompt, then answer each question (repeatable)",
                cxxopts::value<std::vector<std::string>>())
            ("n,n-predict", "tokens to generate", cxxopts::value<int32_t>()->default_value("32"))
            ("compare-full", "also decode with the full cache: greedy agreement and mean KL")
            ("dump-capture", "write the prefill capture (SPEC §7) to this file", cxxopts::value<std::string>())
            ("t,threads", "CPU threads", cxxopts::value<int32_t>()->default_value("0"))
            ("json", "print one JSON object")
            ("verbose", "show llama.cpp's log")
            ("h,help", "show this help");
        // clang-format on
        ecokv::tools::add_method_options(options);
        const auto args = options.parse(argc, argv);
        if (args.count("help")) {
            std::printf("%s\n", options.help({ "", "method" }).c_str());
            return 0;
        }
        ecokv::tools::reject_positional(args);
        ecokv::tools::require(args, { "method" });
        if (args.count("prompt") + args.count("file") > 1 ||
            (args.count("prompt") + args.count("file") == 0 && args.count("image") == 0)) {
            throw error("give the prompt with exactly one of -p/--prompt and -f/--file (or only --image)");
        }
        const ecokv::method_spec spec       = ecokv::parse_method(args["method"].as<std::string>());
        ecokv::method_params     params     = ecokv::tools::method_params_from(args);
        params.validate(ecokv::method_window(spec, params));
        const int32_t n_predict = args["n-predict"].as<int32_t>();
        if (n_predict < 1 || n_predict > 1000000) {
            throw error("-n " + std::to_string(n_predict) + " must lie in [1, 1000000]");
        }
        const std::vector<std::string> questions =
            args.count("question") ? args["question"].as<std::vector<std::string>>() : std::vector<std::string>{};
        for (const std::string & q : questions) {
            if (q.empty()) {
                throw error("--question must not be empty");
            }
        }
        set_llama_verbose(args.count("verbose") > 0);
        const int32_t   n_threads = args["threads"].as<int32_t>();
        // Without --model: the bundled tiny VLM and its projector (models/tiny-vlm.md).
        const bool        bundled     = args.count("model") == 0;
        const std::string model_path  = bundled ? k_bundled_model : args["model"].as<std::string>();
        const std::string mmproj_path = args.count("mmproj") ? args["mmproj"].as<std::string>()
                                        : bundled            ? k_bundled_mmproj
                                                             : "";
        if (bundled && !std::filesystem::exists(k_bundled_model)) {  // e.g. an installed binary, source tree gone
            throw error("no --model given and the bundled default " + k_bundled_model + " is missing");
        }
        const model_ptr model = load_model(model_path);

        // The prompt: the whole chat prompt, or the context part in question mode. Images go where the text has
        // the media marker, or before the text.
        const std::vector<std::string> images =
            args.count("image") ? args["image"].as<std::vector<std::string>>() : std::vector<std::string>{};
        if (images.empty() ? args.count("mmproj") > 0 : mmproj_path.empty()) {
            throw error("--image needs --mmproj and --mmproj needs at least one --image");
        }
        const std::string text = with_media_markers(args.count("prompt") ? args["prompt"].as<std::string>()
                                                    : args.count("file") ? read_text(args["file"].as<std::string>())
                                                                         : std::string(),
                                                    images.size());
        const prompt_parts parts = questions.empty() ? prompt_parts{ el::chat_prompt(model.get(), text), "" }
                                                     : split_prompt(model.get(), text);
        std::vector<std::vector<llama_token>> question_tokens;
        int32_t                               n_question_max = 0;
        for (const std::string & q : questions) {
            question_tokens.push_back(el::tokenize(model.get(), q + parts.question_suffix, false));
            n_question_max = std::max(n_question_max, int32_t(question_tokens.back().size()));
        }

        const projector_ptr projector =
            images.empty() ? nullptr : load_projector(mmproj_path, model.get(), n_threads);
        const prompt  prompt(model.get(), projector.get(), parts.context, images);
        const int32_t n_cells = prompt.n_cells();
        const int32_t n_extra = n_predict + n_question_max;
        const int32_t n_train = llama_model_n_ctx_train(model.get());
        if (int64_t(n_cells) + n_extra > n_train) {
            throw error("prompt of " + std::to_string(n_cells) + " tokens plus " + std::to_string(n_extra) +
                        " new ones exceeds the model's context of " + std::to_string(n_train));
        }

        // Prefill with the query capture attached.
        const int32_t        window = ecokv::method_window(spec, params);
        el::query_capture    capture(model.get(), std::max(32, window), spec.scorer == "h2o");
        const llama_context_params cparams        = context_params(n_cells + n_extra, n_threads);
        llama_context_params       prefill_params = cparams;
        capture.attach(prefill_params);
        el::context_ptr ctx(llama_init_from_model(model.get(), prefill_params));
        if (!ctx) {
            throw error("cannot create a context of " + std::to_string(cparams.n_ctx) + " cells");
        }
        const prefill_result pr           = prompt.prefill(ctx.get());
        const double         prefill_s    = pr.seconds;
        const int32_t        n_prompt     = pr.n_tokens;
        const int32_t        n_past       = pr.n_past;
        const auto &         first_logits = pr.first_logits;
        capture.set_active(false);

        // The prefill's state (a host copy of the full cache) lives only until the compressed cache exists; the
        // full context itself only when --compare-full needs it.
        auto state = std::make_unique<el::prefill_state>(ctx.get(), capture, pr.modality);
        if (args.count("dump-capture")) {
            ecokv::write_capture(args["dump-capture"].as<std::string>(), state->view());
        }
        const el::compressed_cache cc = el::compress_context(model.get(), *state, spec, params, n_extra, cparams);
        const uint64_t     kv_full    = el::kv_bytes_allocated(ctx.get(), state->kv_bytes_per_cell());
        const uint64_t     kv_prompt  = uint64_t(n_prompt) * state->kv_bytes_per_cell();
        const std::string  model_desc = state->view().model;
        state.reset();
        const std::vector<uint8_t> full_state = args.count("compare-full") ? save_state(ctx.get()) : std::vector<uint8_t>{};
        if (!args.count("compare-full")) {
            ctx.reset();
        }

        nlohmann::json out = {
            { "model", model_desc },              { "method", cc.sel.method },     { "budget", params.budget },
            { "window", cc.sel.window },          { "prompt_tokens", n_prompt },   { "image_tokens", pr.n_media },
            { "kv_bytes_full", kv_full },         { "kv_bytes_compressed", cc.kv_bytes_alloc },
            { "kv_bytes_prompt", kv_prompt },
            { "kv_bytes_kept", cc.kv_bytes_kept }, { "cells_per_head", cc.n_cells }, { "prefill_s", prefill_s },
            { "compress_s", cc.select_seconds + cc.rebuild_seconds },
        };
        nlohmann::json             answers    = nlohmann::json::array();
        double                     decode_s = 0, agreement = 0, mean_kl = 0;
        int64_t                    n_decoded = 0, n_compared = 0;
        const size_t               n_runs    = std::max<size_t>(1, questions.size());
        for (size_t qi = 0; qi < n_runs; ++qi) {
            std::vector<float> logits = first_logits;
            llama_pos          pos    = n_past;
            if (!questions.empty()) {
                if (qi > 0) {
                    restore_state(cc.ctx.get(), cc.state);
                }
                logits = el::decode(cc.ctx.get(), question_tokens[qi], pos);
                pos += llama_pos(question_tokens[qi].size());
            }
            const el::generation gen = el::greedy(cc.ctx.get(), logits, pos, n_predict, false);
            decode_s += gen.seconds;
            n_decoded += int64_t(gen.tokens.size());
            nlohmann::json answer = { { "text", el::detokenize(model.get(), gen.tokens) } };
            if (!questions.empty()) {
                answer["question"] = questions[qi];
            }
            if (args.count("compare-full")) {
                std::vector<float> full_logits = first_logits;
                if (!questions.empty()) {
                    restore_state(ctx.get(), full_state);
                    full_logits = el::decode(ctx.get(), question_tokens[qi], n_past);
                }
                const el::generation full = el::greedy(ctx.get(), full_logits, pos, n_predict, true);
                restore_state(cc.ctx.get(), cc.state);
                std::vector<float> first;
                if (!questions.empty()) {
                    first = el::decode(cc.ctx.get(), question_tokens[qi], n_past);
                }
                const el::fidelity c = el::compare_to_full(cc.ctx.get(), full, pos, questions.empty() ? nullptr : &first);
                answer["full_text"] = el::detokenize(model.get(), full.tokens);
                answer["agreement"] = c.n ? nlohmann::json(c.agreement) : nlohmann::json(nullptr);
                answer["mean_kl"]   = c.n ? nlohmann::json(c.mean_kl) : nlohmann::json(nullptr);
                agreement += c.agreement * c.n;
                mean_kl += c.mean_kl * c.n;
                n_compared += c.n;
                if (!questions.empty() || qi + 1 < n_runs) {
                    restore_state(ctx.get(), full_state);
                }
            }
            answers.push_back(answer);
        }
        out["text"]              = answers[0]["text"];
        out["answers"]           = answers;
        out["decode_s"]          = decode_s;
        out["decode_tokens_per_s"] = decode_s > 0 ? double(n_decoded) / decode_s : 0.0;
        out["agreement"]         = n_compared ? nlohmann::json(agreement / n_compared) : nlohmann::json(nullptr);
        out["mean_kl"]           = n_compared ? nlohmann::json(mean_kl / n_compared) : nlohmann::json(nullptr);

        if (args.count("json")) {
            std::printf("%s\n", out.dump().c_str());
            return 0;
        }
        for (const auto & a : answers) {
            if (a.contains("question")) {
                std::printf("Q: %s\n", a["question"].get<std::string>().c_str());
            }
            std::printf("%s\n", a["text"].get<std::string>().c_str());
            if (a.contains("full_text") && a.contains("question")) {  // short answers: show both
                std::printf("(full cache: %s)\n", a["full_text"].get<std::string>().c_str());
            }
        }
        const double mib = 1048576.0;
        std::printf("\nmethod    %s (budget %d, window %d)\n", cc.sel.method.c_str(), params.budget, cc.sel.window);
        std::printf("prompt    %d tokens (text %d, image %d)\n", n_prompt, n_prompt - pr.n_media, pr.n_media);
        // Entries are what a method keeps; llama.cpp allocates contexts in multiples of 256 cells, so for short
        // prompts the allocated sizes hide the saving.
        std::printf("kv cache  prompt entries %.3f MiB -> kept %.3f MiB (%.0f%% saved)\n", kv_prompt / mib,
                    cc.kv_bytes_kept / mib, 100.0 * (1.0 - double(cc.kv_bytes_kept) / double(std::max<uint64_t>(1, kv_prompt))));
        std::printf("allocated full %.3f MiB -> compressed %.3f MiB (%d cells per head; contexts are multiples of 256 cells)\n",
                    kv_full / mib, cc.kv_bytes_alloc / mib, cc.n_cells);
        std::printf("time      prefill %.3f s, compress %.4f s (select %.4f, rebuild %.4f), decode %.3f s (%.1f tok/s)\n",
                    prefill_s, cc.select_seconds + cc.rebuild_seconds, cc.select_seconds, cc.rebuild_seconds,
                    decode_s, out["decode_tokens_per_s"].get<double>());
        if (n_compared) {
            std::printf("vs full   agreement %.3f over %lld tokens, mean KL %.4f\n", agreement / n_compared,
                        (long long) n_compared, mean_kl / n_compared);
        }
        return 0;
    });
}
