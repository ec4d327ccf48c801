// The llama.cpp engine of the evaluation runner: one prefill per item, the full cache's answer as the reference,
// every compression from the same prefill (or, chunked, from its own chunked prefill), fidelity teacher-forced on the
// reference.
#include "ecokv/llama-eval.h"

#include <optional>

namespace ecokv::llama {

namespace {

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
        a.kv_bytes = full_->kv_bytes_allocated();
        a.kv_bytes_kept = uint64_t(full_->n_prompt()) * full_->kv_bytes_per_cell();
        return a;
    }

    // With decode_compress the answer compresses again as it goes, from a prefill of its own that keeps the window's
    // queries (one chunk unless chunked); each step's cache then depends on the tokens picked before, so no teacher-
    // forced fidelity is measured.
    eval_answer answer_compressed(const compression & how) override {
        const bool       again = how.decode_compress > 0;
        const int32_t    chunk = how.chunk > 0 ? how.chunk : again ? prompt_->n_cells() : 0;
        sequence         c = chunk > 0 ? s_.prefill_chunked(*prompt_, chunk, how.spec, how.params, n_extra_)
                                       : full_->compress(how.spec, how.params, n_extra_, true);
        const generation g = again ? c.answer_compressing(question_, n_predict_, how.decode_compress, how.spec, how.params)
                                   : c.answer(question_, n_predict_);
        fidelity_report  f;
        if (!again) {
            c.rewind();
            f = c.fidelity(question_, reference_);
        }
        eval_answer           a;
        a.output         = s_.detokenize(g.tokens);
        a.decode_s       = g.seconds;
        a.compress_s     = c.compression().select_seconds + c.compression().rebuild_seconds;
        a.kv_bytes       = c.kv_bytes_allocated();
        a.kv_bytes_kept  = c.kv_bytes_kept();
        a.agreement      = f.n ? std::optional<double>(f.agreement) : std::nullopt;
        a.mean_kl        = f.n ? std::optional<double>(f.mean_kl) : std::nullopt;
        a.attn_rel_error = f.attn_rel_error;
        return a;
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
