// Snapshots: a sequence's cache saved to host memory, restored into its own context or resumed in a new one (a
// compressed cache's ragged layout made again first).
#include "ecokv/error.h"
#include "kv-store.h"
#include "session-impl.h"

#include <algorithm>

namespace ecokv::llama {

namespace {

// Replaces the context's cache by the snapshot's. A compressed snapshot first gets a ragged cache of its layout, with
// room for n_room tokens besides the ones it holds. Checked before the cache is cleared where it can be; when llama.cpp still
// rejects the state the cache is left empty.
void write_state(llama_context * ctx, const snapshot & s, int32_t n_room) {
    const uint32_t n_cells = state_cell_count(s.state);
    if (!s.layout.empty()) {
        const std::vector<int32_t> layers = compressed_layers(ctx);
        const int32_t              n_kv   = llama_model_n_head_kv(llama_get_model(ctx));
        if (s.layout.size() != layers.size() * size_t(n_kv)) {
            throw error("the snapshot's layout does not match the model");
        }
        std::vector<uint32_t> n_keep(size_t(llama_model_n_layer(llama_get_model(ctx))) * n_kv, 0);  // by model layer
        for (size_t i = 0; i < layers.size(); ++i) {
            std::copy_n(s.layout.begin() + std::ptrdiff_t(i * n_kv), n_kv, n_keep.begin() + std::ptrdiff_t(layers[i] * n_kv));
        }
        if (n_cells == 0 ||
            !llama_kv_set_ragged(ctx, n_keep.data(), n_cells - 1 + uint32_t(n_room), 0, nullptr, nullptr)) {
            throw error("cannot make a compressed cache for a snapshot of " + std::to_string(n_cells) + " cells");
        }
    } else if (llama_kv_layout(ctx) == 2) {
        throw error("a full-cache snapshot cannot be restored into a compressed sequence");
    } else if (n_cells == 0 || n_cells > llama_n_ctx(ctx)) {
        throw error("a snapshot of " + std::to_string(n_cells) + " cells does not fit a context of " +
                    std::to_string(llama_n_ctx(ctx)) + " cells");
    }
    llama_memory_clear(llama_get_memory(ctx), true);
    if (llama_state_seq_set_data(ctx, s.state.data(), s.state.size(), 0) != s.state.size()) {
        throw error("llama.cpp rejected the sequence state (" + std::to_string(n_cells) + " cells); the sequence is "
                    "now empty");
    }
}

}  // namespace

sequence session::resume(const snapshot & s, const compression & c, int32_t n_extra, bool probe) const {
    // A compressed conversation that compresses again records its window's queries.
    const bool again = c.enabled && (c.decode_compress > 0 || c.recompress_slack >= 0) && !s.layout.empty();
    const method_requirements record = again ? requirements(c.spec, c.params) : method_requirements{};
    const int32_t n_window_queries = record.n_window_queries;
    auto q            = std::make_unique<sequence::impl>();
    q->s              = impl_.get();
    // a compressed snapshot's context: room for the cells it holds and n_extra, and an iSWA model's window
    q->cparams        = context_params(impl_->opts, s.n_cells + n_extra + (s.layout.empty() ? 0 : window_cells(model())));
    q->n_cells        = s.n_cells;
    q->n_extra        = n_extra;
    q->kv_kept        = s.kv_bytes_kept;
    q->how            = c;
    llama_context_params cp = q->cparams;
    if (probe || n_window_queries > 0) {
        q->capture = std::make_unique<query_capture>(model(), std::max(1, n_window_queries), record.full_queries);
        q->capture->set_active(false);
        q->capture->attach(cp);
    }
    q->ctx = new_context(model(), cp);
    sequence out(std::move(q));
    out.restore(s);
    if (n_window_queries > 0) {
        out.record_queries();
    }
    return out;
}

snapshot sequence::save() const {
    snapshot s;
    s.state          = read_sequence(impl_->ctx.get());
    s.layout         = impl_->layout;
    s.logits         = impl_->logits;
    s.own_logits     = impl_->own_logits;
    // the cells held: a compressed cache's label cell and the tokens decoded since; else the prompt's and those
    s.n_cells        = int32_t(state_cell_count(s.state));
    s.n_past         = impl_->n_past;
    s.kv_bytes_kept  = kv_bytes_kept();
    if (!s.layout.empty()) {
        s.kept_cells       = impl_->kept_cells;
        s.kept_modality    = impl_->kept_modality;
        s.kept_accumulated = impl_->folded_accumulated();
        s.cells_seen       = impl_->cells_seen;
        s.decoded_modality = impl_->decoded_modality;
    }
    return s;
}

void sequence::restore(const snapshot & s) {
    // The prompt's capture no longer describes the cache: a restored sequence is a plain one.
    impl_->state.reset();
    impl_->prefilled = false;
    impl_->comp      = {};
    try {
        write_state(impl_->ctx.get(), s, impl_->n_extra);
    } catch (...) {
        impl_->n_past = impl_->origin_n_past = impl_->n_cells = 0;
        impl_->logits.clear();
        impl_->origin_logits.clear();
        throw;
    }
    impl_->layout         = s.layout;
    impl_->ragged_room    = s.layout.empty() ? 0 : int32_t(state_cell_count(s.state)) - 1 + impl_->n_extra;
    impl_->kept_cells     = s.kept_cells;
    impl_->kept_modality  = s.kept_modality;
    impl_->kept_accumulated = s.kept_accumulated;
    impl_->cells_seen     = s.cells_seen;
    impl_->decoded_modality = s.decoded_modality;
    if (!s.layout.empty() && s.decoded_modality.empty()) {  // a snapshot without bookkeeping: decoded text
        impl_->decoded_modality.assign(size_t(state_cell_count(s.state)) - 1, uint8_t(modality::text));
    }
    impl_->origin_decoded = impl_->decoded_modality.size();
    impl_->n_folded       = s.kept_accumulated.empty() ? 0 : int32_t(impl_->decoded_modality.size());
    if (impl_->capture) {
        impl_->capture->forget_full_queries();  // the queries before the snapshot are in its kept_accumulated
    }
    impl_->query_bytes_mark = impl_->capture ? impl_->capture->bytes_to_host() : 0;
    impl_->n_cells        = s.layout.empty() ? s.n_cells : int32_t(*std::max_element(s.layout.begin(), s.layout.end()));
    impl_->kv_kept        = s.kv_bytes_kept;
    impl_->logits         = impl_->origin_logits = s.logits;
    impl_->own_logits     = impl_->origin_own = s.own_logits;
    impl_->n_past         = impl_->origin_n_past = s.n_past;
    impl_->turn_cells     = 0;  // a resumed conversation's next turn begins here
    impl_->mark_origin();
}

}  // namespace ecokv::llama
