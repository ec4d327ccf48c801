// ecokv-llama: many sequences decoding in one llama.cpp context (continuous batching over ragged caches, issue 50).
//
// A `batch` owns one context whose KV cache is a ragged pool (patches/llama.cpp, llama_kv_set_ragged_pool): n_cells
// cells shared by every live sequence (llama.cpp's -c, as its unified cache), plus, in every KV head of every layer,
// n_kept_rows rows for the entries compressed sequences kept. A sequence enters as a snapshot (sequence::save(): a
// compressed cache brings its kept rows, head by head, a full one only cells), decodes with the others in one
// llama_decode per step(), and leaves as a snapshot again. Its tokens attend to its own kept rows and cells only, so
// its greedy tokens and logits are those of decoding it alone (tests/llama/test-batch.cpp).
//
// Admission is by memory: a sequence is admitted while the cells it holds plus the tokens it may still decode fit
// the cells not promised to others, and its kept rows fit every head's free rows; fits() says whether it would.
//
// Threads: a batch belongs to one thread at a time.
#pragma once

#include "ecokv/llama-session.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace ecokv::llama {

struct batch_options {
    int32_t n_cells     = 0;   // KV cells of all live sequences together
    int32_t n_kept_rows = 0;   // kept rows of every KV head, shared by the compressed sequences
    int32_t n_seq_max   = 16;  // live sequences at most
};

class batch {
  public:
    // Throws ecokv::error when the context cannot be made (memory, a model whose cache cannot be ragged).
    batch(const session & s, const batch_options & o);
    ~batch();
    batch(const batch &)             = delete;
    batch & operator=(const batch &) = delete;

    // Whether `s` with room for n_new more tokens would be admitted now.
    bool    fits(const snapshot & s, int32_t n_new) const;
    // Admits `s` with room for n_new more tokens; returns its seat (the sequence id in the context). Throws
    // ecokv::error when it does not fit or llama.cpp rejects the state (nothing is left of it then).
    int32_t admit(const snapshot & s, int32_t n_new);
    // One llama_decode: each seat's tokens at its next positions (a seat at most once). Afterwards logits(seat) is the
    // distribution after its last token. Throws ecokv::error (the seats are then as before the call) when a seat
    // would decode more tokens than it was admitted with, or llama.cpp fails.
    void    step(const std::vector<std::pair<int32_t, std::vector<llama_token>>> & work);
    // The seat's state as a snapshot (its layout and bookkeeping as admitted, the tokens decoded since appended as
    // text), and the seat freed: its cells and kept rows return to the pool.
    snapshot release(int32_t seat);
    // Frees the seat without saving it.
    void     drop(int32_t seat);

    const std::vector<float> & logits(int32_t seat) const;
    llama_pos                  n_past(int32_t seat) const;
    int32_t                    n_live() const;          // seats taken
    int32_t                    cells_promised() const;  // cells held and reserved for the tokens still to decode
    int32_t                    n_cells() const;         // the pool's cells
    int32_t                    kept_rows_used() const;  // the most kept rows any head holds now
    uint64_t                   kv_bytes_allocated() const;
    uint64_t                   kv_bytes_of_cells(int32_t n) const;  // K and V of n cells in every head and layer

  private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace ecokv::llama
