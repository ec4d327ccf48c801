// ecokv run without options: the README's main job. The bundled tiny-qwen2vl reads its sample receipt; the page's
// KV cache is compressed before any question is known (question-agnostic), then each of the page's questions is
// answered by the full cache, by each method at the budget, and by the full cache of the page resized by mtmd to as
// many KV entries (--image-max-tokens), the baseline a user short of memory would pick instead. Answers are scored
// with the sample dataset's own metric, by the evaluation's engine (one prefill per question, as `ecokv eval`).
#include "run/main-job.h"

#include "ecokv/error.h"
#include "ecokv/eval-runner.h"
#include "ecokv/llama-eval.h"
#include "ecokv/metrics.h"
#include "ecokv/options.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace ecokv::tools {

namespace {

using json   = nlohmann::json;
namespace el = ecokv::llama;

// One column of the table: a cache and its answers to every question of the page.
struct column {
    json     j = json::object();
    json     answers = json::array();
    int      n_correct = 0;
    uint64_t kv_kept = 0, kv_alloc = 0;  // per question, the same for every question of the page
};

void add_answer(column & c, const eval_item & item, const eval_answer & a, const metric_info & metric) {
    const std::string text    = answer_text(a.output, metric.whole_output);
    const metric_item scored  = { text, item.answers, item.type };
    const bool        correct = evaluate(metric.name, { &scored, 1 }).score == 1.0;
    c.n_correct += correct ? 1 : 0;
    c.kv_kept  = a.kv_bytes_kept;
    c.kv_alloc = a.kv_bytes;
    c.answers.push_back({ { "question", item.question }, { "truth", item.answers[0] }, { "text", text },
                          { "correct", correct } });
}

std::string mib_text(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f MiB", double(bytes) / 1048576.0);
    return buf;
}

json finish(column & c, uint64_t bytes_per_cell) {
    c.j["answers"]             = c.answers;
    c.j["correct"]             = c.n_correct;
    c.j["kv_bytes_kept"]       = c.kv_kept;
    c.j["kv_bytes_allocated"]  = c.kv_alloc;
    c.j["kv_entries_per_head"] = double(c.kv_kept) / double(bytes_per_cell);  // a mean over heads where they differ
    return c.j;
}

}  // namespace

json main_job(const prompt_options & po, const std::vector<main_job_cache> & caches, int32_t budget, int32_t n_predict) {
    const metric_info & metric = find_metric(find_dataset("generated").metric);
    method_requirements needs;
    for (const main_job_cache & m : caches) {
        needs |= requirements(m.how.spec, m.how.params);
    }
    const el::session                s(po.session);
    std::unique_ptr<eval_engine>     engine = el::make_eval_engine(s);
    std::vector<column>              cols(caches.size() + 1);
    eval_prefill                     pf;
    for (const eval_item & item : po.sample) {
        pf = engine->prefill(item, eval_mode::agnostic, n_predict, needs);
        add_answer(cols[0], item, engine->answer_full(), metric);
        for (size_t k = 0; k < caches.size(); ++k) {
            add_answer(cols[k + 1], item, engine->answer_compressed(caches[k].how), metric);
        }
    }
    json out = { { "main_job", true },         { "model", s.description() },
                 { "image", po.sample[0].images[0] }, { "prompt_tokens", pf.prompt_tokens },
                 { "image_tokens", pf.image_tokens }, { "metric", metric.name }, { "questions", po.sample.size() } };
    cols[0].j = { { "label", "full cache" }, { "method", std::string(k_full_cache) } };
    // Not `json columns = { x }`: a one-element braced list of a json object is that object, not an array of it.
    json columns = json::array({ finish(cols[0], pf.kv_bytes_per_cell) });
    for (size_t k = 0; k < caches.size(); ++k) {
        cols[k + 1].j = { { "label", caches[k].label }, { "method", caches[k].how.name() },
                          { "budget", caches[k].how.params.budget } };
        columns.push_back(finish(cols[k + 1], pf.kv_bytes_per_cell));
    }

    // The smaller image at equal KV entries: the page's text cells stay, its image gets the rest of the budget.
    const int32_t n_text   = pf.prompt_tokens - pf.image_tokens;
    el::session_options so = po.session;
    so.image_max_tokens    = std::max(1, budget - n_text);
    const el::session            small(so);
    std::unique_ptr<eval_engine> small_engine = el::make_eval_engine(small);
    column                       smaller;
    int32_t                      small_image_tokens = 0;
    for (const eval_item & item : po.sample) {
        small_image_tokens = small_engine->prefill(item, eval_mode::agnostic, n_predict, {}).image_tokens;
        add_answer(smaller, item, small_engine->answer_full(), metric);
    }
    smaller.j = { { "label", "smaller image" },
                  { "method", std::string(k_full_cache) },
                  { "image_max_tokens", so.image_max_tokens },
                  { "image_tokens", small_image_tokens } };
    columns.push_back(finish(smaller, pf.kv_bytes_per_cell));
    out["budget"]  = budget;
    out["columns"] = columns;
    return out;
}

void print_main_job(const json & out) {
    const json &  cols = out["columns"];
    const int32_t n_q  = out["questions"];
    std::printf("tiny-qwen2vl reads a receipt (%s: %d image tokens, %d KV entries per head).\n",
                std::filesystem::path(out["image"].get<std::string>()).filename().c_str(), out["image_tokens"].get<int>(),
                out["prompt_tokens"].get<int>());
    std::printf("Each cache holds the page before any question is asked; then the page's %d questions:\n\n", n_q);
    const auto cell = [](const std::string & s) { return s.size() > 13 ? s.substr(0, 12) + "~" : s; };
    std::printf("%-20s %-8s", "question", "truth");
    for (const json & c : cols) {
        std::printf(" %-16s", c["label"].get<std::string>().c_str());
    }
    std::printf("\n");
    for (int32_t q = 0; q < n_q; ++q) {
        const json & first = cols[0]["answers"][size_t(q)];
        std::printf("%-20s %-8s", first["question"].get<std::string>().c_str(), first["truth"].get<std::string>().c_str());
        for (const json & c : cols) {
            const json & a = c["answers"][size_t(q)];
            std::printf(" %-13s %s ", cell(a["text"].get<std::string>()).c_str(), a["correct"].get<bool>() ? "ok" : "--");
        }
        std::printf("\n");
    }
    std::printf("%-29s", "correct");
    for (const json & c : cols) {
        std::printf(" %-16s", (std::to_string(c["correct"].get<int>()) + "/" + std::to_string(n_q)).c_str());
    }
    std::printf("\n%-29s", "KV entries per head");
    for (const json & c : cols) {
        std::printf(" %-16.0f", c["kv_entries_per_head"].get<double>());
    }
    std::printf("\n%-29s", "KV memory of the page");
    for (const json & c : cols) {
        std::printf(" %-16s", mib_text(c["kv_bytes_kept"].get<uint64_t>()).c_str());
    }
    const json & small = cols.back();
    std::printf("\n\nThe methods keep %d entries per KV head of %d; the smaller image is the page resized by mtmd to at "
                "most %d image tokens (--image-max-tokens), %d here.\nOne method in detail: ecokv run --model "
                "models/tiny-qwen2vl.gguf --mmproj models/tiny-qwen2vl-mmproj.gguf --image IMAGE --question Q --method M "
                "--budget B --compare-full\n",
                out["budget"].get<int>(), out["prompt_tokens"].get<int>(), small["image_max_tokens"].get<int>(),
                small["image_tokens"].get<int>());
}

}  // namespace ecokv::tools
