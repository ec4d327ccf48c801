// Chunked prefill (docs/chunked-prefill.md): a prompt decoded chunk by chunk into the room of a compressed cache and
// compressed again after each chunk (recompression.cpp), so that no KV head holds more than its kept entries and one
// chunk.
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

}  // namespace ecokv::llama
