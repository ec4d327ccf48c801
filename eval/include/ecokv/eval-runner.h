// ecokv eval: the evaluation runner. Every item of a dataset is prefilled once by an engine, answered with the full
// cache and with every (method, budget), scored with the dataset's metric, and appended to results JSONL as it
// comes, so a killed run resumes where it stopped. Engine-free: an engine adapter (ecokv/llama-eval.h) implements
// eval_engine.
#pragma once

#include "ecokv/datasets.h"
#include "ecokv/method.h"
#include "ecokv/metrics.h"
#include "ecokv/options.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ecokv {

// prompt: the question is part of the compressed prompt (the papers' setting); agnostic: the context is compressed
// before the question is appended, so the answer can only come from kept entries.
enum class eval_mode { prompt, agnostic };

// One item's prefill, as the engine reports it.
struct eval_prefill {
    int32_t  prompt_tokens = 0;
    int32_t  image_tokens  = 0;
    uint64_t kv_bytes_full = 0;  // KV bytes the full cache allocates
    double   prefill_s     = 0;
    uint64_t kv_bytes_per_cell = 0;  // K + V of one token in every KV head and layer
};

// One answer to the current item: the full cache's or a compressed cache's.
struct eval_answer {
    std::string           output;            // the generated text
    double                decode_s   = 0;
    double                compress_s = 0;
    uint64_t              kv_bytes   = 0;    // KV bytes allocated by the cache that answered
    std::optional<double> agreement;         // vs the full cache, teacher-forced; compressed answers with >= 1 step
    std::optional<double> mean_kl;
    std::vector<double>   attn_rel_error;    // per layer; empty when not measured
    uint64_t              kv_bytes_kept = 0; // of kv_bytes, the prompt's entries held (not the room for new tokens)
    int32_t               entries_held  = 0; // --turns: entries of the longest KV head after the answer
    int32_t               n_tokens      = 0; // tokens generated (decode tokens/s: n_tokens / decode_s)
};

// --turns: one turn of a conversation, its prompt (the whole conversation so far) and its answer.
struct eval_turn {
    eval_prefill prefill;  // prompt_tokens: the conversation's cells up to this question; prefill_s: this turn's
    eval_answer  answer;
};

// What the runner needs of an engine: one item at a time, one prefill per item, any number of compressions of it.
class eval_engine {
  public:
    virtual ~eval_engine() = default;
    // Prefills `item` with a capture that meets `needs`; the full cache's answer of up to n_predict tokens becomes
    // the reference of every compressed answer until the next prefill.
    virtual eval_prefill prefill(const eval_item & item, eval_mode mode, int32_t n_predict,
                                 const method_requirements & needs)        = 0;
    virtual eval_answer  answer_full()                                      = 0;
    // The answer from the item's prompt compressed with c (c.chunk > 0: from a chunked prefill of its own).
    virtual eval_answer  answer_compressed(const compression & c)          = 0;
    // --turns: the items (questions about one context, in order) asked one after another in one conversation: the
    // context prefilled and, with c, compressed before the first question; each later question appended after the
    // answers before it, as a chat client sends them back; with c.recompress_slack >= 0 compressed again after each
    // answer (docs/conversations.md). c null: the full cache. One turn per item.
    virtual std::vector<eval_turn> converse(const std::vector<eval_item> & turns, const compression * c,
                                            int32_t n_predict);
};

// Everything that decides a run. Every field that changes results is recorded in <out_dir>/config.json, and a
// resume with another value is refused.
struct eval_options {
    std::string              dataset;
    std::string              data_dir;
    std::string              metric;          // empty: the dataset's
    eval_mode                mode = eval_mode::prompt;
    std::vector<std::string> methods;         // "full" (k_full_cache) is the uncompressed cache
    std::vector<int32_t>     budgets;
    compression              settings;        // every other compression option (the table's); method and budget
                                              // are set per run
    // The engine's options that change results (the adapter's table: llama::recorded_engine_options), recorded in
    // config.json by their keys.
    std::vector<std::pair<std::string, option_value>> engine;
    int32_t                  limit     = 0;   // only the first N items (0: all)
    int32_t                  shard     = 0;   // this process runs items shard, shard + n_shards, ...
    int32_t                  n_shards  = 1;
    int32_t                  n_predict = 16;
    std::string              out_dir;
    std::string              model;           // files, recorded in config.json by name and content hash
    std::string              projector;
    bool                     strict = false;  // an item that cannot be processed stops the run (else: recorded)
    // The multi-turn protocol: consecutive items about the same context (images and text) form one conversation,
    // asked in order (eval_engine::converse); each turn is scored and compared with the full cache's conversation.
    // Implies the agnostic mode.
    bool                     turns  = false;
};

// A validated run: methods canonical, the items of this shard, the config, what was already done.
struct eval_plan {
    eval_options             options;
    const metric_info *      metric = nullptr;
    std::vector<eval_item>   items;           // this shard's items, in order
    std::vector<size_t>      conversations;   // --turns: the items of each of this shard's conversations, in order
    method_requirements      needs;           // the union over methods (one capture serves all)
    std::string              results_path;
    std::string              config_id;       // hash of config.json, in every record: a record names its run
    std::set<std::string>    done;            // keys of the records already in results_path (a resumed run)
    std::shared_ptr<void>    lock;            // <out_dir>/lock, held while the plan lives: one writer per directory
};

// Checks every option, method, budget, the dataset and config.json before any engine work; throws ecokv::error.
// Takes the directory's lock (another live eval on it is an error; a lock left by a dead one is taken over) and
// writes config.json on a first run.
eval_plan plan_eval(const eval_options & options);

// progress(items done, items in this shard)
using eval_progress = std::function<void(size_t done, size_t total)>;

// Runs the plan on the engine, appending one JSON record per (item, method, budget) to plan.results_path. An item
// the engine cannot process (ecokv::error: bad image, over-long prompt, ...) gets records with its "error" and the
// run goes on, unless options.strict. A failed write throws, leaving no partial record.
void run_eval(const eval_plan & plan, eval_engine & engine, const eval_progress & progress = {});

// The answer the metric scores: the first line of the output, trimmed; the whole output, trimmed, for metrics that
// score whole outputs (transcriptions).
std::string answer_text(const std::string & output, bool whole_output);

}  // namespace ecokv
