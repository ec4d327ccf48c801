// A turn (docs/architecture.md, "A turn"): how a compression applies to a prompt, written once for every client.
// session::prefill(p, c, ...) prefills and compresses the context before the question; the sequence it gives holds
// `c`, so that its decodes compress again (recompression.cpp) and end_turn() applies the slack.
#include "ecokv/error.h"
#include "session-impl.h"

#include <algorithm>

namespace ecokv::llama {

namespace {

// A compression that compresses again after the first: while decoding, or at the end of each turn.
bool compresses_again(const compression & c) {
    return c.enabled && (c.decode_compress > 0 || c.recompress_slack >= 0);
}

}  // namespace

bool compressible_by_copy(const compression & c) { return c.enabled && c.chunk == 0 && !compresses_again(c); }

void check_prompt_window(int32_t n_cells, const compression & c) {
    if (const int32_t window = method_window(c.spec, c.params); n_cells <= window) {
        throw error("the prompt has " + std::to_string(n_cells) + (n_cells == 1 ? " token" : " tokens") + "; " +
                    c.spec.name() + " needs more than its observation window of " + std::to_string(window));
    }
}

sequence session::prefill(const prompt & p, const compression & c, int32_t n_extra, size_t split) const {
    split                       = std::min(split, p.units().size());
    const int32_t context_cells = p.cells_before(split);
    const int32_t n_room        = p.n_cells() - context_cells + n_extra;  // the question's cells and the new tokens
    const bool    again         = compresses_again(c);
    // Within the budget a prompt is kept whole (SPEC §2); one that compresses again is held compressed (ragged) from
    // its start, so that it can, once it holds more than the window.
    const bool compress = c.enabled && context_cells > (again ? method_window(c.spec, c.params) : c.params.budget);
    if (compress && c.decode_compress > 0) {
        check_recompression(c.spec, c.params, c.decode_compress);
    }
    sequence seq = [&] {
        if (!compress) {
            return prefill(p, n_room, {}, split);
        }
        if (c.chunk > 0) {  // the cache never holds more than the budget plus one chunk
            return prefill_chunked(p, c.chunk, c.spec, c.params, n_room, split);
        }
        sequence one = prefill(p, n_room, requirements(c.spec, c.params), split);
        one.compress_in_place(c.spec, c.params);
        return one;
    }();
    if (compress && again) {
        seq.record_queries();
    }
    sequence::impl & q = *seq.impl_;
    q.how              = c;
    q.turn_cells = q.origin_turn_cells = 0;  // the turn begins with the question, appended next
    return seq;
}

}  // namespace ecokv::llama
