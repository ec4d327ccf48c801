// Sequences: one conversation's cache in its own llama_context, from the prefill through compression (into a new
// context or in place) to greedy decoding, answers and fidelity; the cache's life that every client walks.
#include "ecokv/error.h"
#include "kv-store.h"
#include "session-impl.h"

#include <mtmd-helper.h>
#include <mtmd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace ecokv::llama {

namespace {

// Per layer, the mean over steps of ||c - f|| / ||f|| (steps paired in order).
std::vector<double> attention_error(const std::vector<std::vector<std::vector<float>>> & full,
                                    const std::vector<std::vector<std::vector<float>>> & comp) {
    const size_t n_steps = std::min(full.size(), comp.size());
    if (n_steps == 0 || full[0].empty()) {
        return {};
    }
    std::vector<double> err(full[0].size(), 0.0);
    for (size_t s = 0; s < n_steps; ++s) {
        for (size_t il = 0; il < err.size(); ++il) {
            const std::vector<float> &f = full[s][il], &c = comp[s][il];
            double                    diff = 0, norm = 0;
            for (size_t i = 0; i < f.size() && i < c.size(); ++i) {
                diff += (double(c[i]) - f[i]) * (double(c[i]) - f[i]);
                norm += double(f[i]) * f[i];
            }
            err[il] += norm > 0 ? std::sqrt(diff / norm) / double(n_steps) : 0.0;
        }
    }
    return err;
}

}  // namespace

compressed_cache sequence::impl::compress(const prefill_state & st, const method_spec & spec,
                                          const method_params & params, int32_t n_room, query_capture * observer,
                                          bool in_place) const {
    return naming_model(
        [&] { return compress_context(s->model, st, spec, params, n_room, cparams, observer, in_place); });
}

const prefill_state & sequence::impl::prefill() const {
    if (!prefilled || !capture) {
        throw error("the sequence has no prefill capture (prefill it with method requirements to compress it)");
    }
    if (!state) {
        state = std::make_unique<prefill_state>(ctx.get(), *capture, modality, n_prompt, origin_n_past, values);
    }
    return *state;
}

void sequence::impl::become_compressed(const impl & full, compressed_cache && cc) {
    if (cc.ctx) {
        ctx = std::move(cc.ctx);
    }
    state.reset();
    prefilled = false;
    layout    = ragged_layout(cc.sel);
    n_cells   = int32_t(*std::max_element(layout.begin(), layout.end()));
    n_past = origin_n_past = full.origin_n_past;
    logits = origin_logits = full.origin_logits;
    own_logits = origin_own = false;  // the prefill computed them on the full cache
    kv_kept    = cc.sel.kv_bytes_kept;
    cells_seen = full.n_prompt;
    decoded_modality.clear();
    origin_decoded   = 0;
    ragged_room      = n_extra;
    query_bytes_mark = capture ? capture->bytes_to_host() : 0;
    if (capture) {
        capture->forget_full_queries();  // the prompt's: from now on those of the cells decoded since
    }
    kept_cells.clear();
    kept_modality.clear();
    kept_accumulated.clear();
    for (const auto & layer : cc.sel.layers) {
        for (const head_selection & h : layer) {
            kept_cells.push_back(h.kept);
            if (!h.accumulated.empty()) {
                kept_accumulated.push_back(h.accumulated);
            }
            if (!full.modality.empty()) {
                auto & m = kept_modality.emplace_back();
                for (int32_t c : h.kept) {
                    m.push_back(full.modality[size_t(c)]);
                }
            }
        }
    }
    comp = { std::move(cc.sel), cc.select_seconds, cc.rebuild_seconds, cc.capture_seconds, cc.bytes_to_host };
    // An iSWA model's window as the prompt left it: the full sequence may have decoded (and overwritten) since.
    write_window(ctx.get(), full.origin_window);
    mark_origin();
}

int32_t sequence::impl::head_cells() const {
    if (layout.empty()) {
        return store_cells(ctx.get(), false);
    }
    // the longest compressed head, or an iSWA model's sliding-window heads if they hold more
    return std::max(store_cells(ctx.get(), true), int32_t(*std::max_element(layout.begin(), layout.end())) + 1 + ragged_room);
}

void sequence::impl::note_peak(uint64_t transient) {
    peak_cells = std::max(peak_cells, head_cells());
    peak_bytes = std::max(peak_bytes, llama::kv_bytes_allocated(ctx.get()) + transient);
}

void sequence::impl::take_threads() {
    if (!s->opts.threads_now) {
        return;
    }
    const int32_t n = std::max(1, s->opts.threads_now());
    if (n != int32_t(cparams.n_threads) || n != int32_t(cparams.n_threads_batch)) {
        llama_set_n_threads(ctx.get(), n, n);
        cparams.n_threads = cparams.n_threads_batch = n;
    }
}

void sequence::impl::decode(const std::vector<llama_token> & tokens) {
    logits     = consistent([&] { return llama::decode(ctx.get(), tokens, n_past); });
    n_past    += llama_pos(tokens.size());
    own_logits = true;
    note_decoded(tokens.size());
}

// The projector's embeddings of an image (or audio) chunk, on this context's threads. A projector context encodes one
// at a time (it is not thread-safe); the embeddings are copied out, so that their decode into this sequence's own
// context runs beside another request's encode.
std::vector<float> sequence::impl::encode_media(const mtmd_input_chunk * c) const {
    const projector_pool::lease projector = s->projectors.take();
    mtmd_set_n_threads(projector.get(), int(cparams.n_threads));
    if (mtmd_encode_chunk(projector.get(), c) != 0) {
        throw error("encoding an image of the prompt failed");
    }
    const float * out = mtmd_get_output_embd(projector.get());
    return { out, out + mtmd_input_chunk_get_n_tokens(c) * size_t(llama_model_n_embd_inp(s->model)) };
}

void sequence::impl::eval(const prompt::impl & in, size_t from, size_t to, bool may_end_with_image) {
    take_threads();
    if (!in.chunks) {
        decode(std::vector<llama_token>(in.tokens.begin() + ptrdiff_t(from), in.tokens.begin() + ptrdiff_t(to)));
        return;
    }
    const llama_pos start      = n_past;
    const size_t    decoded    = decoded_modality.size();
    const int32_t   turn       = turn_cells;
    bool            image_last = false;
    try {
        size_t unit = 0;
        for (size_t i = 0; i < mtmd_input_chunks_size(in.chunks.get()) && unit < to; ++i) {
            const mtmd_input_chunk * c = mtmd_input_chunks_get(in.chunks.get(), i);
            if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
                size_t              n    = 0;
                const llama_token * text = mtmd_input_chunk_get_tokens_text(c, &n);
                const size_t        a = std::max(from, unit), b = std::min(to, unit + n);
                if (a < b) {
                    decode(std::vector<llama_token>(text + (a - unit), text + (b - unit)));
                    image_last = false;
                }
                unit += n;
                continue;
            }
            if (unit++ < from) {
                continue;
            }
            if (s->projectors.empty()) {
                throw error("an image prompt needs a session with a projector");
            }
            const std::vector<float> embd = encode_media(c);
            llama_pos                next = n_past;
            if (mtmd_helper_decode_image_chunk(s->projectors.first(), ctx.get(), c, const_cast<float *>(embd.data()),
                                               n_past, 0, int32_t(llama_n_batch(ctx.get())), &next, nullptr,
                                               nullptr) != 0) {
                throw error("evaluating an image of the prompt failed (context full?)");
            }
            n_past     = next;
            image_last = true;
            note_decoded(mtmd_input_chunk_get_n_tokens(c), uint8_t(mtmd_input_chunk_get_type(c) ==
                                                                   MTMD_INPUT_CHUNK_TYPE_AUDIO ? modality::audio
                                                                                               : modality::image));
        }
        if (image_last && !may_end_with_image) {  // libmtmd computes no logits for image embeddings: this throws
            logits     = last_logits(ctx.get());
            own_logits = true;
        }
    } catch (...) {  // as decode(): nothing of this call stays
        llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, start, -1);
        n_past = start;
        decoded_modality.resize(decoded);
        turn_cells = turn;
        throw;
    }
}

void sequence::impl::advance(size_t n_decoded) {
    if (n_decoded > 0) {
        logits     = last_logits(ctx.get());
        own_logits = true;
    }
    n_past += llama_pos(n_decoded);
    note_decoded(n_decoded);
}

sequence::sequence(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
sequence::sequence(sequence &&) noexcept             = default;
sequence & sequence::operator=(sequence &&) noexcept = default;
sequence::~sequence()                                = default;

sequence session::prefill(const prompt & p, int32_t n_extra, const method_requirements & needs, size_t n_units) const {
    return prefill_units(p, std::min(n_units, p.units().size()), n_extra, 0, needs);
}

// prefill(), with a logical batch of at least n_batch cells (the chunks decoded later into a smaller context).
sequence session::prefill_units(const prompt & p, size_t n_units, int32_t n_extra, int32_t n_batch,
                                const method_requirements & needs) const {
    const int32_t n_cells = p.cells_before(n_units);
    if (n_cells == 0) {
        throw error("the prompt is empty");
    }
    check_fits(*this, n_cells, n_extra);
    auto q     = std::make_unique<sequence::impl>();
    q->s       = impl_.get();
    q->cparams = context_params(impl_->opts, n_cells + n_extra);
    q->cparams.n_batch = std::max(q->cparams.n_batch, uint32_t(std::min(n_batch, impl_->opts.n_batch)));
    llama_context_params pp = q->cparams;
    if (needs.n_window_queries > 0 || needs.full_queries) {
        // At least 32 window rows, as a capture file must hold (SPEC §7).
        q->capture = std::make_unique<query_capture>(model(), std::max(32, needs.n_window_queries), needs.full_queries);
        q->capture->attach(pp);
        q->capture->expect_tokens(n_cells);
        q->values = needs.values;
    }
    q->ctx             = new_context(model(), pp);
    q->prefilled_bytes = llama::kv_bytes_allocated(q->ctx.get());

    const auto           t0 = std::chrono::steady_clock::now();
    const prompt::impl & in = *p.impl_;
    q->eval(in, 0, n_units, n_units < p.units().size());
    q->prefill_s = seconds_since(t0);
    if (q->capture) {
        q->capture->set_active(false);
    }
    q->prefilled     = true;
    q->turn_cells    = 0;  // the prompt is no turn's: prefill(p, c, ...) decodes the question after it
    q->origin_n_past = q->n_past;
    q->origin_logits = q->logits;
    q->mark_origin();
    q->n_cells = q->n_prompt = n_cells;
    q->n_extra               = n_extra;
    if (!in.modality.empty()) {
        q->modality.assign(in.modality.begin(), in.modality.begin() + n_cells);
        q->n_media = int32_t(std::count_if(q->modality.begin(), q->modality.end(), [](uint8_t m) { return m != 0; }));
    }
    q->note_peak();
    return sequence(std::move(q));
}

int32_t                    sequence::n_cells() const { return impl_->n_cells; }
int32_t sequence::n_held() const {
    return impl_->layout.empty() ? impl_->n_cells + int32_t(impl_->n_past - impl_->origin_n_past)
                                 : impl_->n_cells + int32_t(impl_->decoded_modality.size());
}
llama_pos                  sequence::n_past() const { return impl_->n_past; }
const std::vector<float> & sequence::logits() const { return impl_->logits; }
int32_t                    sequence::n_prompt() const { return impl_->n_prompt; }
int32_t                    sequence::n_media() const { return impl_->n_media; }
const std::vector<uint8_t> & sequence::modality() const { return impl_->modality; }
double                     sequence::prefill_seconds() const { return impl_->prefill_s; }
uint64_t                   sequence::kv_bytes_prefilled() const { return impl_->prefilled_bytes; }
const ecokv::compression & sequence::held_compression() const { return impl_->how; }
int32_t                    sequence::n_recompressions() const { return impl_->n_again; }
const compression_info &   sequence::compression() const { return impl_->comp; }

uint64_t sequence::kv_bytes_per_cell() const { return llama::kv_bytes_per_cell(impl_->ctx.get()); }
uint64_t sequence::kv_bytes_of_cells(int32_t n) const { return llama::kv_bytes_of_cells(impl_->ctx.get(), n); }

uint64_t sequence::kv_bytes_allocated() const { return llama::kv_bytes_allocated(impl_->ctx.get()); }

uint64_t sequence::kv_bytes_kept() const {
    return impl_->kv_kept ? impl_->kv_kept : kv_bytes_of_cells(impl_->n_cells);
}

const capture_view & sequence::capture() const { return impl_->prefill().view(); }

void sequence::release_capture() { impl_->state.reset(); }

sequence sequence::compress(const method_spec & spec, const method_params & params, int32_t n_extra, bool probe) const {
    check_prompt_window(impl_->n_prompt, { true, spec, params });
    const prefill_state &          st = impl_->prefill();
    std::unique_ptr<query_capture> observer;
    if (probe) {
        observer = std::make_unique<query_capture>(impl_->s->model, 1, false);
        observer->set_active(false);
    }
    compressed_cache cc = impl_->compress(st, spec, params, n_extra, observer.get(), false);
    auto q       = std::make_unique<impl>();
    q->s         = impl_->s;
    q->cparams   = impl_->cparams;
    q->capture   = std::move(observer);
    q->n_extra   = n_extra;
    q->n_prompt  = impl_->n_prompt;
    q->n_media   = impl_->n_media;
    q->modality  = impl_->modality;
    q->prefill_s = impl_->prefill_s;
    q->become_compressed(*impl_, std::move(cc));
    q->peak_cells = impl_->peak_cells;
    q->peak_bytes = impl_->peak_bytes;
    q->note_peak(kv_bytes_allocated());  // this sequence's cache stays beside the new one
    return sequence(std::move(q));
}

void sequence::compress_in_place(const method_spec & spec, const method_params & params) {
    check_prompt_window(impl_->n_prompt, { true, spec, params });
    const uint64_t   before = kv_bytes_allocated();
    compressed_cache cc     = impl_->compress(impl_->prefill(), spec, params, impl_->n_extra, nullptr, true);
    impl_->become_compressed(*impl_, std::move(cc));
    impl_->note_peak(before);  // the full cache and the kept entries, while these were written
}

const std::vector<std::vector<int32_t>> & sequence::kept_cells() const { return impl_->kept_cells; }
int32_t                                   sequence::peak_kv_cells() const { return impl_->peak_cells; }
uint64_t                                  sequence::peak_kv_bytes() const { return impl_->peak_bytes; }

void sequence::decode(const std::vector<llama_token> & tokens) { impl_->decode_turn(tokens); }

void sequence::append(const prompt & p, size_t from) {
    if (from > p.units().size()) {
        throw error("append: the prompt has " + std::to_string(p.units().size()) + " units, not " + std::to_string(from));
    }
    if (from < p.units().size()) {  // nothing left to append is no decode
        impl_->eval(*p.impl_, from, p.units().size());
    }
}

generation sequence::greedy(int32_t n, bool keep_logits) {
    return answer({}, n, keep_logits);
}

generation sequence::answer(const std::vector<llama_token> & question, int32_t n, bool keep_logits) {
    if (!question.empty()) {
        impl_->decode_turn(question);
    }
    if (impl_->compresses_while_decoding()) {  // token by token, each decode compressing again when due
        return impl_->greedy_turn(n, keep_logits);
    }
    generation g = impl_->steps(nullptr, [&](const step_hook &) {
        return llama::greedy(impl_->ctx.get(), impl_->logits, impl_->n_past, n, keep_logits);
    });
    impl_->advance(g.tokens.empty() ? 0 : g.tokens.size() - 1);  // the last token picked is not decoded
    return g;
}

reference sequence::answer_reference(const std::vector<llama_token> & question, int32_t n) {
    if (!question.empty()) {
        impl_->decode(question);
    }
    reference r;
    r.answer = impl_->steps(&r.attention, [&](const step_hook & hook) {
        return llama::greedy(impl_->ctx.get(), impl_->logits, impl_->n_past, n, true, hook);
    });
    impl_->advance(r.answer.tokens.empty() ? 0 : r.answer.tokens.size() - 1);
    return r;
}

fidelity_report sequence::fidelity(const std::vector<llama_token> & question, const reference & full) {
    if (!question.empty()) {
        impl_->decode(question);
    }
    const std::vector<float>                     first = impl_->logits;
    const bool                                   own   = impl_->own_logits;
    std::vector<std::vector<std::vector<float>>> attention;
    const llama::fidelity f = impl_->steps(&attention, [&](const step_hook & hook) {
        return compare_to_full(impl_->ctx.get(), full.answer, impl_->n_past, own ? &first : nullptr, hook);
    });
    impl_->advance(full.answer.tokens.empty() ? 0 : full.answer.tokens.size() - 1);
    return { f.agreement, f.mean_kl, f.n, attention_error(full.attention, attention) };
}

void sequence::impl::mark_origin() {
    origin_window     = read_window(ctx.get());
    origin_turn_cells = turn_cells;
}

void sequence::rewind() {
    if (!llama_memory_seq_rm(llama_get_memory(impl_->ctx.get()), 0, impl_->origin_n_past, -1)) {
        throw error("llama.cpp cannot remove the decoded tokens of this sequence");
    }
    write_window(impl_->ctx.get(), impl_->origin_window);
    impl_->n_past     = impl_->origin_n_past;
    impl_->decoded_modality.resize(impl_->origin_decoded);
    impl_->turn_cells = impl_->origin_turn_cells;
    impl_->logits     = impl_->origin_logits;
    impl_->own_logits = impl_->origin_own;
}

}  // namespace ecokv::llama
