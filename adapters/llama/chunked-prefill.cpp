// Chunked prefill (docs/chunked-prefill.md): a prompt decoded chunk by chunk into the room of a compressed cache and
// compressed again after each chunk, so that no KV head holds more than its kept entries and one chunk; and the same
// re-compression during an answer (answer_compressing: every N decoded cells).
#include "ecokv/error.h"
#include "ecokv/llama-generate.h"
#include "kv-store.h"
#include "session-impl.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>

namespace ecokv::llama {

namespace {

// The capture header of a chunk: the model's dimensions and, per layer, the last n_new rows `capture` recorded (at
// most its window) as window queries, and the full queries it recorded since the last compression or fold (n_full
// rows, or none); keys and values are the caller's (per-head candidates).
capture_view chunk_capture(const llama_context * ctx, const query_capture & capture, int32_t n_new, int32_t n_full) {
    const llama_model *        model  = llama_get_model(ctx);
    const std::vector<int32_t> layers = compressed_layers(ctx);
    capture_view               cap;
    cap.n_layers   = int32_t(layers.size());
    cap.n_heads    = llama_model_n_head(model);
    cap.n_kv_heads = llama_model_n_head_kv(model);
    for (const int32_t il : layers) {
        tensor_view q   = capture.queries(il);
        const int64_t n = std::min<int64_t>(q.ne[1], n_new);
        q.data          = q.row(q.ne[1] - n);
        q.ne[1]         = n;
        tensor_view full = capture.full_queries(il);
        if (!full.empty() && full.ne[1] != n_full) {
            throw error("the capture holds the full queries of " + std::to_string(full.ne[1]) + " cells, not of the " +
                        std::to_string(n_full) + " decoded since the last compression");
        }
        cap.layers.push_back({ {}, {}, q, n_full > 0 ? full : tensor_view{} });
        cap.head_dim  = int32_t(q.ne[0]);
        cap.n_queries = int32_t(n);
    }
    char desc[256] = {};
    llama_model_desc(model, desc, sizeof desc);
    cap.model = desc;
    return cap;
}

// Every chunk frees and allocates again MiB-sized buffers (the candidates' copies, the scorers' work, the ragged
// stores). glibc raises its mmap threshold to the size of each mmapped block freed, so that the next ones come from
// the heap, whose free space it keeps: the resident set would grow with the number of chunks (measured: 121 MiB after
// 4 chunks, 156 MiB after 16, on a 28-layer model whose caches hold 7 MiB). Giving the free heap back after each
// chunk keeps the resident set bounded, whatever the allocator's settings.
void release_free_heap() {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

// A query capture recording for this object's lifetime (the new cells of a chunk, not the decodes after).
struct recording {
    query_capture & capture;
    explicit recording(query_capture & c) : capture(c) { capture.set_active(true); }
    ~recording() { capture.set_active(false); }
    recording(const recording &)             = delete;
    recording & operator=(const recording &) = delete;
};

// Unit boundaries of chunks of at most n_chunk cells (a unit larger than that, an image, alone); a chunk of no more
// than n_window cells joins the next one, the last such the one before.
std::vector<size_t> chunk_bounds(const prompt & p, size_t n_units, int32_t n_chunk, int32_t n_window) {
    std::vector<size_t> b = { 0 };
    for (size_t u = 0; u < n_units; ++u) {
        if (u > b.back() && p.cells_before(u + 1) - p.cells_before(b.back()) > n_chunk) {
            b.push_back(u);
        }
    }
    b.push_back(n_units);
    auto cells = [&](size_t k) { return p.cells_before(b[k + 1]) - p.cells_before(b[k]); };
    for (size_t k = 0; k + 1 < b.size() && b.size() > 2;) {
        if (cells(k) > n_window) {
            ++k;
        } else {
            b.erase(b.begin() + ptrdiff_t(k + 2 < b.size() ? k + 1 : k));  // into the next, or the last into the one before
        }
    }
    return b;
}

}  // namespace

sequence session::prefill_chunked(const prompt & p, int32_t n_chunk, const method_spec & spec,
                                  const method_params & params, int32_t n_extra, size_t n_units) const {
    check_chunk(spec, params, n_chunk);
    const method_requirements needs    = requirements(spec, params);
    const int32_t             n_window = method_window(spec, params);
    n_units                            = std::min(n_units, p.units().size());
    if (n_units == 0) {
        throw error("the prompt is empty");
    }
    check_fits(*this, p.cells_before(n_units), n_extra);
    const std::vector<size_t> b = chunk_bounds(p, n_units, n_chunk, n_window);
    int32_t                   room = 0;  // the largest chunk after the first
    for (size_t k = 1; k + 1 < b.size(); ++k) {
        room = std::max(room, p.cells_before(b[k + 1]) - p.cells_before(b[k]));
    }
    sequence seq = prefill_units(p, b[1], 0, room, needs);
    seq.impl_->n_extra = b.size() > 2 ? room : n_extra;
    seq.compress_in_place(spec, params);
    for (size_t k = 1; k + 1 < b.size(); ++k) {
        seq.extend(p, b[k], b[k + 1], spec, params, k + 2 < b.size() ? room : n_extra);
    }
    return seq;
}

void sequence::extend(const prompt & p, size_t from, size_t to, const method_spec & spec, const method_params & params,
                      int32_t n_room) {
    impl & q = *impl_;
    if (q.layout.empty() || !q.capture || q.n_past != q.origin_n_past) {
        throw error("extend: the sequence is not a compressed one of a chunked prefill, or decoded since");
    }
    const int32_t first = p.cells_before(from), n_new = p.cells_before(to) - first;
    const int32_t n_window = method_window(spec, params);
    if (n_new > q.n_extra || n_new <= n_window) {
        throw error("extend: " + std::to_string(n_new) + " new cells must fit the room of " + std::to_string(q.n_extra) +
                    " and outnumber the window of " + std::to_string(n_window));
    }
    const auto t_eval = std::chrono::steady_clock::now();
    {
        const recording rec(*q.capture);
        q.capture->expect_tokens(q.capture->n_tokens() + n_new);
        q.eval(*p.impl_, from, to, to < p.units().size());
    }
    q.prefill_s += seconds_since(t_eval);
    q.reselect(spec, params, n_room);
}

capture_view sequence::impl::candidates_capture(const ragged_candidates & cand) const {
    const int32_t n_new = int32_t(decoded_modality.size());
    capture_view  cap   = chunk_capture(ctx.get(), *capture, n_new, n_new - n_folded);
    cap.heads           = cand.heads();
    cap.head_dim_v      = int32_t(cap.heads[0].values.ne[0]);
    for (size_t i = 0; i < cap.heads.size(); ++i) {
        const size_t n = kept_cells[i].size() + size_t(n_new);
        if (!kept_modality.empty()) {  // new cells of a multimodal sequence: the prompt's, or decoded text
            cap.heads[i].modality = kept_modality[i];
            cap.heads[i].modality.insert(cap.heads[i].modality.end(), decoded_modality.begin(), decoded_modality.end());
        }
        if (cap.has_full_queries() && i < kept_accumulated.size()) {  // streaming H2O: what the cells had so far
            cap.heads[i].prior_attention = kept_accumulated[i];
            cap.heads[i].prior_attention.resize(n, 0.0f);
        }
        cap.n_tokens = std::max(cap.n_tokens, int32_t(n));
    }
    return cap;
}

std::vector<std::vector<float>> sequence::impl::folded_accumulated() const {
    const int32_t n_new = int32_t(decoded_modality.size());
    if (kept_accumulated.empty() || !capture || n_new == n_folded) {
        return kept_accumulated;
    }
    const ragged_candidates cand(ctx.get(), layout, ragged_room, n_new, false);
    return naming_model([&] { return accumulated_attention(candidates_capture(cand), { int32_t(cparams.n_threads) }); });
}

void sequence::impl::reselect(const method_spec & spec, const method_params & params, int32_t n_room,
                              int32_t n_keep_last) {
    impl &        q     = *this;
    const int32_t first = q.cells_seen, n_new = int32_t(q.decoded_modality.size());
    q.note_peak();
    // The candidates: each head's kept cells, then the new ones, whose last queries are the window.
    const auto              t_capture = std::chrono::steady_clock::now();
    const ragged_candidates cand(q.ctx.get(), q.layout, q.ragged_room, n_new, requirements(spec, params).values);
    const capture_view      cap = q.candidates_capture(cand);
    compression_info info;
    info.capture_seconds = seconds_since(t_capture);
    info.bytes_to_host   = cand.bytes_to_host() + q.capture->bytes_to_host() - q.query_bytes_mark;
    q.query_bytes_mark   = q.capture->bytes_to_host();
    auto             t0 = std::chrono::steady_clock::now();
    const compress_options opts = { int32_t(q.cparams.n_threads), n_keep_last };
    info.sel = q.naming_model([&] { return ecokv::compress(cap, spec, params, opts); });
    info.select_seconds = seconds_since(t0);
    t0                  = std::chrono::steady_clock::now();
    const uint64_t before = llama::kv_bytes_allocated(q.ctx.get());
    context_ptr fresh = q.rebuilds_in_new_context() ? q.replacement_context(n_room) : nullptr;
    make_ragged(fresh ? fresh.get() : q.ctx.get(), cap, info.sel, n_room, q.n_past - 1,
                { q.ctx.get(), cap.n_kv_heads, q.layout, q.ragged_room });
    if (fresh) {
        write_window(fresh.get(), read_window(q.ctx.get()));
        q.ctx        = std::move(fresh);
        q.ran_graphs = false;
    }
    info.rebuild_seconds = seconds_since(t0);

    for (size_t i = 0; i < q.kept_cells.size(); ++i) {  // the new cells numbered on, their modality after the kept's
        for (int32_t c = 0; c < n_new; ++c) {
            q.kept_cells[i].push_back(first + c);
        }
        if (!q.kept_modality.empty()) {
            q.kept_modality[i] = cap.heads[i].modality;
        }
    }
    q.cells_seen  = first + n_new;
    q.n_folded    = 0;
    q.n_extra     = n_room;
    q.ragged_room = n_room;
    q.decoded_modality.clear();
    q.origin_decoded = 0;
    q.capture->forget_full_queries();
    q.kept_accumulated.clear();
    for (const auto & layer : info.sel.layers) {
        for (const head_selection & h : layer) {
            if (!h.accumulated.empty()) {
                q.kept_accumulated.push_back(h.accumulated);
            }
        }
    }
    q.layout         = ragged_layout(info.sel);
    q.n_cells = int32_t(*std::max_element(q.layout.begin(), q.layout.end()));
    q.kv_kept = info.sel.kv_bytes_kept;
    for (size_t i = 0; i < q.kept_cells.size(); ++i) {
        const auto & kept = info.sel.layers[i / cap.n_kv_heads][i % cap.n_kv_heads].kept;
        for (size_t j = 0; j < kept.size(); ++j) {
            q.kept_cells[i][j] = q.kept_cells[i][size_t(kept[j])];  // kept is ascending: j <= kept[j]
            if (!q.kept_modality.empty()) {
                q.kept_modality[i][j] = q.kept_modality[i][size_t(kept[j])];
            }
        }
        q.kept_cells[i].resize(kept.size());
        if (!q.kept_modality.empty()) {
            q.kept_modality[i].resize(kept.size());
        }
    }
    q.origin_n_past = q.n_past;
    q.origin_logits = q.logits;
    q.own_logits = q.origin_own = false;  // computed before this compression
    q.mark_origin();
    info.select_seconds += q.comp.select_seconds;  // every chunk's compression
    info.rebuild_seconds += q.comp.rebuild_seconds;
    info.capture_seconds += q.comp.capture_seconds;
    info.bytes_to_host += q.comp.bytes_to_host;
    q.comp = std::move(info);
    q.note_peak(before);
    release_free_heap();
}

void sequence::record_queries() {
    impl & q = *impl_;
    if (!q.capture || q.capture->n_queries() < 2) {
        throw error("record_queries: the sequence has no query capture (prefill it with method requirements, or "
                    "resume it with window queries)");
    }
    q.capture->set_active(true);
    q.capture->expect_tokens(-1);  // one query row a step, each read as it comes
    q.records_decoded = true;
}

generation sequence::answer_compressing(const std::vector<llama_token> & question, int32_t n, int32_t every,
                                        const method_spec & spec, const method_params & params) {
    impl & q = *impl_;
    if (q.layout.empty() || !q.capture) {
        throw error("--decode-compress: the sequence must be compressed with its query capture (compressed in place "
                    "after the prompt, or a chunked prefill)");
    }
    check_recompression(spec, params, every);
    const int32_t since = int32_t(q.decoded_modality.size());
    if (every > q.ragged_room || since + int32_t(question.size()) >= q.ragged_room) {
        throw error("--decode-compress " + std::to_string(every) + ": with the question's " +
                    std::to_string(question.size()) + " tokens, must fit the room of " +
                    std::to_string(q.ragged_room - since) + " new tokens");
    }
    const bool recorded = q.records_decoded;
    record_queries();
    const llama_vocab * vocab = llama_model_get_vocab(q.s->model);
    if (!question.empty()) {
        q.decode(question);
    }
    generation out;
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < n; ++i) {
        const llama_token t = argmax(q.logits);
        out.tokens.push_back(t);
        if (llama_vocab_is_eog(vocab, t) || i + 1 == n) {
            break;
        }
        if (int32_t(q.decoded_modality.size()) >= every) {  // the room holds `every` cells: select again first
            q.reselect(spec, params, every);
        }
        q.decode({ t });
    }
    out.seconds = seconds_since(t0);
    if (!recorded) {
        q.capture->set_active(false);
        q.records_decoded = false;
    }
    return out;
}

bool sequence::recompress(const method_spec & spec, const method_params & params, int32_t n_keep, int32_t slack,
                          int32_t n_room) {
    const impl & q = *impl_;
    if (q.layout.empty()) {
        return false;
    }
    n_keep             = std::clamp(n_keep, 0, n_decoded());
    const int64_t held = int64_t(*std::max_element(q.layout.begin(), q.layout.end())) + n_decoded() - n_keep;
    return held > int64_t(params.budget) + slack && compress_again(spec, params, n_keep, n_room);
}

bool sequence::compress_again(const method_spec & spec, const method_params & params, int32_t n_keep,
                              int32_t n_room) {
    impl & q = *impl_;
    if (q.layout.empty() || !q.records_decoded || q.kept_cells.size() != q.layout.size()) {
        throw error("compress_again: the sequence must be compressed (with the kept cells of a snapshot, when "
                    "resumed) and record the queries of what it decodes (record_queries)");
    }
    check_recompression(spec, params, 0);
    const int32_t window = method_window(spec, params);
    if (n_decoded() <= window || q.capture->queries(0).ne[1] < window) {
        return false;  // too few new cells to observe, or their window's queries not all recorded (since a resume)
    }
    q.reselect(spec, params, n_room, std::clamp(n_keep, 0, n_decoded()));
    return true;
}

int32_t sequence::n_decoded() const { return int32_t(impl_->decoded_modality.size()); }

}  // namespace ecokv::llama
