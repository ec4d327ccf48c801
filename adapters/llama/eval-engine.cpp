// The llama.cpp engine of the evaluation runner: one prefill per item, the full cache's answer as the reference,
// every compression from the same prefill (or, chunked, from its own chunked prefill), fidelity teacher-forced on the
// reference.
#include "ecokv/llama-eval.h"

#include <algorithm>
#include <chrono>
#include <optional>

namespace ecokv::llama {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class llama_engine final : public eval_engine {
  public:
    explicit llama_engine(const session & s) : s_(s) {}

    eval_prefill prefill(const eval_item & item, eval_mode mode, int32_t n_predict,
                         const method_requirements & needs) override {
        full_.reset();
        prompt_.reset();
        const std::string context = with_media_markers(item.context, item.images.size());
        prompt_parts      parts;
        question_.clear();
        if (mode == eval_mode::prompt) {
            parts = { s_.chat_prompt(context.empty() ? item.question : context + "\n" + item.question), "" };
        } else {
            parts     = s_.split_prompt(context);
            question_ = s_.tokenize(item.question + parts.question_suffix, false);
        }
        n_predict_ = n_predict;
        n_extra_   = n_predict + int32_t(question_.size());
        prompt_.emplace(s_.make_prompt(parts.context, item.images));
        full_.emplace(s_.prefill(*prompt_, n_extra_, needs));  // chunked too: its probe records the reference's attention
        const eval_prefill pf = { full_->n_prompt(), full_->n_media(), full_->kv_bytes_allocated(),
                                  full_->prefill_seconds(), full_->kv_bytes_per_cell() };
        reference_ = full_->answer_reference(question_, n_predict);
        return pf;
    }

    eval_answer answer_full() override {
        eval_answer a;
        a.output   = s_.detokenize(reference_.answer.tokens);
        a.decode_s = reference_.answer.seconds;
        a.n_tokens = int32_t(reference_.answer.tokens.size());
        a.kv_bytes = full_->kv_bytes_allocated();
        a.kv_bytes_kept = full_->kv_bytes_of_cells(full_->n_prompt());
        return a;
    }

    // From the shared prefill where the compression can be made from it (compressible_by_copy), else from a prefill of
    // its own (chunked; or compressing again as it answers, which keeps the window's queries). Each step's cache of a
    // re-compressing answer depends on the tokens picked before, so no teacher-forced fidelity is measured.
    eval_answer answer_compressed(const compression & how) override {
        const bool       again = how.decode_compress > 0;
        sequence         c     = compressible_by_copy(how) ? full_->compress(how.spec, how.params, n_extra_, true)
                                                           : s_.prefill(*prompt_, how, n_extra_);
        const generation g     = c.answer(question_, n_predict_);
        fidelity_report  f;
        if (!again) {
            c.rewind();
            f = c.fidelity(question_, reference_);
        }
        eval_answer           a;
        a.output         = s_.detokenize(g.tokens);
        a.decode_s       = g.seconds;
        a.n_tokens       = int32_t(g.tokens.size());
        a.compress_s     = c.compression().select_seconds + c.compression().rebuild_seconds;
        a.kv_bytes       = c.kv_bytes_allocated();
        a.kv_bytes_kept  = c.kv_bytes_kept();
        a.agreement      = f.n ? std::optional<double>(f.agreement) : std::nullopt;
        a.mean_kl        = f.n ? std::optional<double>(f.mean_kl) : std::nullopt;
        a.attn_rel_error = f.attn_rel_error;
        return a;
    }

    std::vector<eval_turn> converse(const std::vector<eval_item> & turns, const compression * c,
                                    int32_t n_predict) override {
        full_.reset();  // the single-question state is the next prefill's
        prompt_.reset();
        const compression how = c ? *c : compression::none();
        std::vector<chat_message> messages;
        std::vector<eval_turn>    out;
        std::optional<sequence>   seq;
        std::optional<snapshot>   kept;
        std::vector<uint64_t>     held;  // the units the conversation's cache holds
        for (size_t k = 0; k < turns.size(); ++k) {
            const eval_item & it = turns[k];
            const std::string context = with_media_markers(turns[0].context, turns[0].images.size());
            messages.push_back({ "user", k == 0 ? context + "\n" + it.question : it.question });
            const prompt p = s_.make_prompt(s_.chat_text(messages), turns[0].images);
            eval_turn    t;
            t.prefill.image_tokens  = out.empty() ? 0 : out[0].prefill.image_tokens;  // the context's, every turn
            t.prefill.kv_bytes_full = out.empty() ? 0 : out[0].prefill.kv_bytes_full;
            const auto   t0 = std::chrono::steady_clock::now();
            size_t       from = 0;
            if (k == 0) {  // the context, compressed, then the question
                const prompt before = s_.make_prompt(s_.split_prompt(context).context, turns[0].images);
                from = size_t(std::mismatch(before.units().begin(), before.units().end(), p.units().begin(),
                                            p.units().end()).first - before.units().begin());
                seq.emplace(s_.prefill(p, how, n_predict, from));
                t.prefill.image_tokens  = seq->n_media();
                t.prefill.kv_bytes_full = seq->kv_bytes_prefilled();
                t.answer.compress_s     = seq->compression().select_seconds + seq->compression().rebuild_seconds;
                seq->append(p, from);
            } else {  // the kept conversation, resumed; only the new units decoded
                from = held.size();
                if (p.units().size() <= from || !std::equal(held.begin(), held.end(), p.units().begin())) {
                    throw error("the chat template does not extend the conversation at turn " + std::to_string(k + 1) +
                                ": --turns needs each prompt to begin with the one before and its answer");
                }
                seq.emplace(s_.resume(*kept, how, p.n_cells() - p.cells_before(from) + n_predict));
                seq->append(p, from);
            }
            t.prefill.prompt_tokens     = p.n_cells();
            t.prefill.prefill_s         = seconds_since(t0);
            t.prefill.kv_bytes_per_cell = seq->kv_bytes_per_cell();
            const generation g = seq->greedy(n_predict);
            const size_t n_decoded = g.tokens.empty() ? 0 : g.tokens.size() - 1;  // the last token picked is not
            std::vector<llama_token> answer(g.tokens.begin(), g.tokens.end());     // decoded; an EOG is not text
            if (!answer.empty() && s_.is_end_of_generation(answer.back())) {
                answer.pop_back();
            }
            t.answer.output   = s_.detokenize(answer);
            t.answer.decode_s = g.seconds;
            t.answer.n_tokens = int32_t(g.tokens.size());
            const auto t1 = std::chrono::steady_clock::now();
            seq->end_turn();  // compressed again over budget + recompress_slack
            t.answer.compress_s += seconds_since(t1);
            t.answer.kv_bytes      = seq->kv_bytes_allocated();
            t.answer.kv_bytes_kept = seq->kept_cells().empty()  // uncompressed: every cell held
                                         ? uint64_t(seq->n_held()) * seq->kv_bytes_per_cell()
                                         : seq->kv_bytes_kept() + uint64_t(seq->n_decoded()) * seq->kv_bytes_per_cell();
            t.answer.entries_held  = seq->n_held();
            held.assign(p.units().begin(), p.units().end());
            held.insert(held.end(), g.tokens.begin(), g.tokens.begin() + ptrdiff_t(n_decoded));
            kept = seq->save();
            messages.push_back({ "assistant", t.answer.output });
            out.push_back(std::move(t));
        }
        return out;
    }

  private:
    const session &          s_;
    std::optional<prompt>    prompt_;
    std::optional<sequence>  full_;
    std::vector<llama_token> question_;
    reference                reference_;
    int32_t                  n_predict_ = 0, n_extra_ = 0;
};

}  // namespace

std::unique_ptr<eval_engine> make_eval_engine(const session & s) {
    return std::make_unique<llama_engine>(s);
}

}  // namespace ecokv::llama
