// Many sequences in one context (ecokv/llama-batch.h): a ragged pool (patches/llama.cpp, llama_kv_set_ragged_pool),
// snapshots in and out through llama.cpp's sequence state, one llama_decode per step for every seat's tokens.
#include "ecokv/llama-batch.h"

#include "ecokv/error.h"
#include "kv-store.h"
#include "session-impl.h"

#include <algorithm>
#include <utility>

namespace ecokv::llama {

struct batch::impl {
    struct seat {
        bool               live = false;
        snapshot           admitted;     // layout and bookkeeping as it came in (state dropped)
        llama_pos          n_past   = 0;
        int32_t            n_cells  = 0;  // cells held
        int32_t            n_budget = 0;  // tokens it may still decode
        int32_t            n_decoded = 0;
        std::vector<float> logits;
    };
    const session::impl * s = nullptr;
    context_ptr           ctx;
    int32_t               n_cells = 0, n_kept_rows = 0, n_vocab = 0;
    std::vector<uint32_t> kept_used;  // per (compressed layer, KV head)
    std::vector<seat>     seats;

    const seat & at(int32_t i) const {
        if (i < 0 || size_t(i) >= seats.size() || !seats[size_t(i)].live) {
            throw error("batch: no sequence at seat " + std::to_string(i));
        }
        return seats[size_t(i)];
    }
    seat & at(int32_t i) { return const_cast<seat &>(std::as_const(*this).at(i)); }
    int32_t promised() const {
        int32_t n = 0;
        for (const seat & t : seats) {
            n += t.live ? t.n_cells + t.n_budget : 0;
        }
        return n;
    }
    bool kept_fits(const snapshot & s) const {
        const auto & rows = s.layout;  // kept rows per (compressed layer, KV head); none for a full cache
        if (rows.empty()) {
            return true;
        }
        if (rows.size() != kept_used.size()) {
            throw error("batch: the snapshot's layout does not match the model");
        }
        for (size_t lh = 0; lh < rows.size(); ++lh) {
            if (kept_used[lh] + rows[lh] > uint32_t(n_kept_rows)) {
                return false;
            }
        }
        return true;
    }
    void free_seat(int32_t i) {
        seat & t = seats[size_t(i)];
        llama_memory_seq_rm(llama_get_memory(ctx.get()), i, -1, -1);
        for (size_t lh = 0; lh < t.admitted.layout.size(); ++lh) {
            kept_used[lh] -= t.admitted.layout[lh];
        }
        t = seat{};
    }
};

batch::batch(const session & s, const batch_options & o) : impl_(std::make_unique<impl>()) {
    if (o.n_cells <= 0 || o.n_kept_rows < 0 || o.n_seq_max <= 0) {
        throw error("batch: needs cells > 0, kept rows >= 0 and at least one sequence");
    }
    impl_->s = s.impl_.get();
    llama_context_params p = context_params(s.options(), o.n_cells);
    p.n_seq_max            = uint32_t(o.n_seq_max);
    p.kv_unified           = true;  // one stream: every sequence's cells in one cache, as the pool needs
    impl_->ctx             = new_context(s.model(), p);
    const llama_model * model = s.model();
    const int32_t       n_kv  = llama_model_n_head_kv(model);
    const std::vector<uint32_t> n_keep(size_t(llama_model_n_layer(model)) * n_kv, uint32_t(o.n_kept_rows));
    if (!llama_kv_set_ragged_pool(impl_->ctx.get(), n_keep.data())) {
        throw error("batch: cannot make a ragged pool of " + std::to_string(o.n_kept_rows) + " kept rows a head for " +
                    s.description());
    }
    impl_->n_cells     = int32_t(llama_n_ctx(impl_->ctx.get()));
    impl_->n_kept_rows = o.n_kept_rows;
    impl_->n_vocab     = llama_vocab_n_tokens(llama_model_get_vocab(model));
    impl_->kept_used.assign(compressed_layers(impl_->ctx.get()).size() * size_t(n_kv), 0);
    impl_->seats.resize(size_t(o.n_seq_max));
}

batch::~batch() = default;

bool batch::fits(const snapshot & s, int32_t n_new) const {
    const int32_t cells = int32_t(state_cell_count(s.state));
    return n_live() < int32_t(impl_->seats.size()) && impl_->promised() + cells + n_new <= impl_->n_cells &&
           impl_->kept_fits(s);
}

int32_t batch::admit(const snapshot & s, int32_t n_new) {
    if (s.state.empty() || s.logits.empty()) {
        throw error("batch: an empty snapshot");
    }
    if (!fits(s, n_new)) {
        throw error("batch: the sequence does not fit (" + std::to_string(state_cell_count(s.state)) + " cells + " +
                    std::to_string(n_new) + " new, " + std::to_string(impl_->promised()) + " of " +
                    std::to_string(impl_->n_cells) + " cells promised)");
    }
    const auto    free_seat = std::find_if(impl_->seats.begin(), impl_->seats.end(), [](const auto & t) { return !t.live; });
    const int32_t i         = int32_t(free_seat - impl_->seats.begin());
    if (llama_state_seq_set_data(impl_->ctx.get(), s.state.data(), s.state.size(), i) != s.state.size()) {
        llama_memory_seq_rm(llama_get_memory(impl_->ctx.get()), i, -1, -1);
        throw error("batch: llama.cpp rejected the sequence state (" + std::to_string(state_cell_count(s.state)) +
                    " cells)");
    }
    impl::seat & t = *free_seat;
    t.live         = true;
    t.admitted     = s;
    t.admitted.state.clear();
    t.n_past   = s.n_past;
    t.n_cells  = int32_t(state_cell_count(s.state));
    t.n_budget = n_new;
    t.logits   = s.logits;
    for (size_t lh = 0; lh < s.layout.size(); ++lh) {
        impl_->kept_used[lh] += s.layout[lh];
    }
    return i;
}

void batch::step(const std::vector<std::pair<int32_t, std::vector<llama_token>>> & work) {
    size_t n_tokens = 0;
    std::vector<bool> seen(impl_->seats.size(), false);
    for (const auto & [i, tokens] : work) {
        impl::seat & t = impl_->at(i);
        if (seen[size_t(i)] || tokens.empty() || int32_t(tokens.size()) > t.n_budget) {
            throw error("batch: seat " + std::to_string(i) + " given no tokens, twice, or more than it was admitted with");
        }
        seen[size_t(i)] = true;
        n_tokens += tokens.size();
    }
    if (n_tokens == 0) {
        return;
    }
    llama_context * ctx = impl_->ctx.get();
    if (n_tokens > llama_n_batch(ctx)) {
        throw error("batch: " + std::to_string(n_tokens) + " tokens in one step, more than the batch of " +
                    std::to_string(llama_n_batch(ctx)));
    }
    if (impl_->s->opts.threads_now) {  // the cores the server's running work shares now
        const int32_t n = std::max(1, impl_->s->opts.threads_now());
        llama_set_n_threads(ctx, n, n);
    }
    llama_batch b = llama_batch_init(int32_t(n_tokens), 0, 1);
    std::vector<int32_t> last;  // per work item, the batch index of its last token
    for (const auto & [i, tokens] : work) {
        const impl::seat & t = impl_->seats[size_t(i)];
        for (size_t k = 0; k < tokens.size(); ++k) {
            const int32_t j = b.n_tokens++;
            b.token[j]     = tokens[k];
            b.pos[j]       = t.n_past + llama_pos(k);
            b.n_seq_id[j]  = 1;
            b.seq_id[j][0] = i;
            b.logits[j]    = k + 1 == tokens.size();
        }
        last.push_back(b.n_tokens - 1);
    }
    const int32_t rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) {
        // llama.cpp removes what a failed decode stored; the seats keep their state
        throw error("batch: llama_decode failed (" + std::to_string(rc) + ") for " + std::to_string(n_tokens) + " tokens");
    }
    for (size_t w = 0; w < work.size(); ++w) {
        impl::seat & t = impl_->seats[size_t(work[w].first)];
        const float * l = llama_get_logits_ith(ctx, last[w]);
        t.logits.assign(l, l + impl_->n_vocab);
        const int32_t n = int32_t(work[w].second.size());
        t.n_past += n;
        t.n_cells += n;
        t.n_budget -= n;
        t.n_decoded += n;
    }
}

snapshot batch::release(int32_t seat) {
    impl::seat & t = impl_->at(seat);
    snapshot     s = t.admitted;
    s.state        = read_sequence(impl_->ctx.get(), seat);
    s.n_cells      = int32_t(state_cell_count(s.state));
    s.n_past       = t.n_past;
    s.logits       = t.logits;
    s.own_logits   = s.own_logits || t.n_decoded > 0;
    if (!s.layout.empty()) {
        s.decoded_modality.resize(s.decoded_modality.size() + size_t(t.n_decoded), uint8_t(modality::text));
    } else {
        s.kv_bytes_kept = llama::kv_bytes_of_cells(impl_->ctx.get(), s.n_cells);
    }
    impl_->free_seat(seat);
    return s;
}

void batch::drop(int32_t seat) {
    impl_->at(seat);
    impl_->free_seat(seat);
}

const std::vector<float> & batch::logits(int32_t seat) const { return impl_->at(seat).logits; }
llama_pos batch::n_past(int32_t seat) const { return impl_->at(seat).n_past; }
int32_t   batch::n_live() const {
    return int32_t(std::count_if(impl_->seats.begin(), impl_->seats.end(), [](const auto & t) { return t.live; }));
}
int32_t  batch::cells_promised() const { return impl_->promised(); }
int32_t  batch::n_cells() const { return impl_->n_cells; }
int32_t  batch::kept_rows_used() const {
    return impl_->kept_used.empty() ? 0 : int32_t(*std::max_element(impl_->kept_used.begin(), impl_->kept_used.end()));
}
uint64_t batch::kv_bytes_allocated() const { return llama::kv_bytes_allocated(impl_->ctx.get()); }
uint64_t batch::kv_bytes_of_cells(int32_t n) const { return llama::kv_bytes_of_cells(impl_->ctx.get(), n); }

}  // namespace ecokv::llama
