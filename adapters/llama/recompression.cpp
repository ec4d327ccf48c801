// Re-compression (docs/conversations.md): a compressed cache compressed again over what each KV head keeps and the
// cells decoded since, whose last queries are the window; after every chunk of a chunked prefill (extend), every
// decode_compress cells of a turn (decode_turn), and at the end of a turn over budget + recompress_slack (end_turn).
#include "ecokv/error.h"
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

}  // namespace

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
    make_ragged(q.ctx.get(), cap, info.sel, n_room, q.n_past - 1, { q.ctx.get(), cap.n_kv_heads, q.layout, q.ragged_room });
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

bool sequence::recompress(const method_spec & spec, const method_params & params, int32_t n_keep, int32_t slack,
                          int32_t n_room) {
    const impl & q = *impl_;
    if (q.layout.empty()) {
        return false;
    }
    n_keep             = std::clamp(n_keep, 0, n_decoded());
    const int64_t held = int64_t(*std::max_element(q.layout.begin(), q.layout.end())) + n_decoded() - n_keep;
    return held > int64_t(params.budget) + slack && impl_->compress_again(spec, params, n_keep, n_room);
}

bool sequence::impl::compress_again(const method_spec & spec, const method_params & params, int32_t n_keep,
                                    int32_t n_room) {
    if (layout.empty() || !records_decoded || kept_cells.size() != layout.size()) {
        throw error("compress_again: the sequence must be compressed (with the kept cells of a snapshot, when "
                    "resumed) and record the queries of what it decodes (record_queries)");
    }
    const int32_t window = method_window(spec, params);
    const int32_t n_new  = int32_t(decoded_modality.size());
    if (n_new <= window || capture->queries(0).ne[1] < window) {
        return false;  // too few new cells to observe, or their window's queries not all recorded (since a resume)
    }
    reselect(spec, params, n_room, std::clamp(n_keep, 0, n_new));
    ++n_again;
    return true;
}

int32_t sequence::n_decoded() const { return int32_t(impl_->decoded_modality.size()); }


void sequence::impl::decode_turn(const std::vector<llama_token> & tokens) {
    if (compresses_while_decoding() && int32_t(decoded_modality.size()) >= how.decode_compress) {
        compress_again(how.spec, how.params, 0, how.decode_compress);  // room for the next decode_compress cells
    }
    decode(tokens);
}

generation sequence::impl::greedy_turn(int32_t n, bool keep_logits) {
    return llama::greedy(llama_model_get_vocab(s->model), logits, n, keep_logits, [&](llama_token t) {
        decode_turn({ t });
        return logits;
    });
}

bool sequence::end_turn() {
    const impl & q = *impl_;
    return q.how.enabled && q.how.recompress_slack >= 0 &&
           recompress(q.how.spec, q.how.params, q.turn_cells, q.how.recompress_slack, 1);
}

}  // namespace ecokv::llama
