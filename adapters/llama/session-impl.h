// ecokv-llama internals, not installed: the state behind the session API (ecokv/llama-session.h), which
// session.cpp, prompt.cpp, sequence.cpp, chunked-prefill.cpp and snapshot.cpp all reach into, and the helpers they
// share. One header, so that the split by concern leaves the classes' state in one place.
#pragma once

#include "ecokv/error.h"
#include "ecokv/llama-adapter.h"
#include "ecokv/llama-session.h"
#include "kv-store.h"

#include <mtmd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ecokv::llama {

struct mtmd_deleter {
    void operator()(mtmd_context * c) const { mtmd_free(c); }
    void operator()(mtmd_input_chunks * c) const { mtmd_input_chunks_free(c); }
    void operator()(mtmd_bitmap * b) const { mtmd_bitmap_free(b); }
};

// The projector's contexts (session_options::n_projectors copies): libmtmd's context is not thread-safe, so an encode
// or a tokenization holds one, and as many images encode at once as there are copies.
class projector_pool {
  public:
    using context = std::unique_ptr<mtmd_context, mtmd_deleter>;
    void           add(context c);
    bool           empty() const { return all_.empty(); }
    mtmd_context * first() const { return all_.front().get(); }  // for what every copy answers alike

    class lease {  // one context, held until the lease ends
      public:
        lease(const projector_pool & p, size_t i) : pool_(&p), i_(i) {}
        lease(const lease &) = delete;
        lease & operator=(const lease &) = delete;
        ~lease();
        mtmd_context * get() const { return pool_->all_[i_].get(); }
      private:
        const projector_pool * pool_;
        size_t                 i_;
    };
    lease take() const;  // a free context, waiting for one when all are held

  private:
    std::vector<context>            all_;
    mutable std::vector<bool>       held_;
    mutable std::mutex              mutex_;
    mutable std::condition_variable freed_;
};

double seconds_since(std::chrono::steady_clock::time_point t0);

// Prompts of at most 2048 cells go in one batch; larger ones in batches of options.n_batch.
llama_context_params context_params(const session_options & o, int32_t n_cells);

context_ptr new_context(const llama_model * model, const llama_context_params & p);

// Throws ecokv::error when a prompt of n_cells and n_extra new tokens exceeds the session's context (session::n_ctx).
void check_fits(const session & s, int64_t n_cells, int32_t n_extra);

struct prompt::impl {
    std::vector<llama_token>                         tokens;
    std::unique_ptr<mtmd_input_chunks, mtmd_deleter> chunks;
    int32_t                                          n_cells = 0;
    int32_t                                          n_media = 0;
    std::vector<uint8_t>                             modality;
    std::vector<uint64_t>                            units;  // see prompt::units()
    std::vector<int32_t>                             cells;  // cells before each unit, and the total at the end
    std::vector<media_grid>                          images;
};

struct session::impl {
    session_options                             opts;
    model_ptr                                   owned;          // null for a borrowed model
    llama_model *                               model = nullptr;
    projector_pool                              projectors;  // empty without a projector
    mutable std::once_flag                      fingerprint_once;  // session::fingerprint(), read once
    mutable uint64_t                            fingerprint = 0;
};

// The members that are not templates are defined in sequence.cpp.
struct sequence::impl {
    const session::impl *          s = nullptr;
    llama_context_params           cparams{};  // of this context (compressed contexts share the V layout)
    std::unique_ptr<query_capture> capture;    // the prefill's queries (and probe), or a probe, or none
    context_ptr                    ctx;
    mutable std::unique_ptr<prefill_state> state;  // views of the prefilled cache, made on demand
    bool                           prefilled = false;
    bool                           values    = true;  // the methods read the values: copy them from a device

    int32_t               n_cells = 0;
    int32_t               n_extra = 0;  // room for new tokens, besides the prompt's or kept entries
    llama_pos             n_past  = 0;
    std::vector<float>    logits;
    bool                  own_logits = true;
    std::vector<uint32_t> layout;       // kept entries per (layer, KV head) of a compressed sequence, else empty
    uint64_t              kv_kept = 0;  // 0: n_cells x bytes per cell
    compression_info      comp;
    std::vector<std::vector<int32_t>> kept_cells;     // per (layer, KV head): the prompt cells it keeps
    std::vector<std::vector<uint8_t>> kept_modality;  // and their modality (empty for a text prompt)
    std::vector<std::vector<float>>   kept_accumulated;  // and their accumulated attention (streaming H2O), or empty;
                                                         // also of the first n_folded cells decoded since
    int32_t                           n_folded = 0;
    int32_t                           peak_cells = 0;
    uint64_t                          peak_bytes = 0;
    // A compressed sequence's cells since its last compression, the candidates a re-compression adds: their modality
    // in order (decode, eval and advance append), numbered on from cells_seen; the room its ragged cache was made with.
    int32_t              cells_seen = 0;  // cells numbered before them (kept_cells' numbers): the prompt's, ...
    std::vector<uint8_t> decoded_modality;
    size_t               origin_decoded = 0;  // of them at the origin (rewind() comes back to it)
    int32_t              ragged_room    = 0;
    bool                 records_decoded = false;  // the capture records the queries of every cell decoded
    uint64_t             query_bytes_mark = 0;     // the capture's bytes_to_host at the last compression

    int32_t              n_prompt = 0, n_media = 0;
    std::vector<uint8_t> modality;
    double               prefill_s = 0;
    uint64_t             prefilled_bytes = 0;  // KV bytes of the prefill's context, before any compression

    // The compression the sequence holds (session::prefill or resume with one), the compressions it made since the
    // first, and the cells decoded since its turn began (a question's and an answer's; at the origin too).
    ecokv::compression   how = ecokv::compression::none();
    int32_t              n_again    = 0;
    int32_t              turn_cells = 0, origin_turn_cells = 0;
    // Where rewind() comes back to: after the prompt, the compression or the restored snapshot. A compressed
    // sequence starts from the prompt's, whatever the full one decoded since.
    llama_pos            origin_n_past = 0;
    std::vector<float>   origin_logits;
    bool                 origin_own = true;
    // An iSWA model's sliding-window cache at the origin (its last window of cells, llama.cpp's partial state), put
    // back by rewind(): with a window-sized cache (swa_full off) the tokens decoded since overwrite its oldest cells.
    std::vector<uint8_t> origin_window;
    void                 mark_origin();  // origin_window from the context as it is now

    // f(), with NaN from the prefill (weights the pre-flight cannot read) named by the model file.
    template <typename F> auto naming_model(F && f) const {
        try {
            return f();
        } catch (const non_finite_error & e) {
            const std::string projector =
                s->opts.mmproj_path.empty() ? "" : " (or the projector " + s->opts.mmproj_path + "'s, for the images)";
            throw error(s->opts.model_path + ": " + e.what() + projector);
        }
    }

    compressed_cache compress(const prefill_state & st, const method_spec & spec, const method_params & params,
                              int32_t n_room, query_capture * observer, bool in_place) const;

    const prefill_state & prefill() const;

    // Becomes the compressed cache `cc` of the prompt of `full` (which may be this very sequence).
    void become_compressed(const impl & full, compressed_cache && cc);

    // KV cells per head as allocated: the usual cache's cells, or a ragged one's longest head with its room.
    int32_t head_cells() const;

    // Compresses again in place over what each (layer, KV head) keeps and the cells decoded since the last compression
    // (decoded_modality), whose last captured queries are the window, the last n_keep_last of them kept whole; leaves
    // room for n_room tokens. The rows read are counted in comp.bytes_to_host with the queries read since.
    void reselect(const method_spec & spec, const method_params & params, int32_t n_room, int32_t n_keep_last = 0);

    // What a re-compression chooses among, as a capture: each head's kept cells then the cells decoded since (cand),
    // their modality, the window's queries and, for streaming H2O, the full queries not folded yet and every
    // candidate's prior attention.
    capture_view candidates_capture(const ragged_candidates & cand) const;
    // kept_accumulated with the queries recorded since folded in (over every cell decoded since): what a snapshot
    // carries, since it holds no queries.
    std::vector<std::vector<float>> folded_accumulated() const;

    // n cells of `m` decoded (compressed sequences count them for reselect).
    void note_decoded(size_t n, uint8_t m = 0) {
        turn_cells += int32_t(n);
        if (!layout.empty()) {
            decoded_modality.insert(decoded_modality.end(), n, m);
        }
    }

    // Records the memory held now, plus `transient` bytes held a moment before together with it.
    void note_peak(uint64_t transient = 0);

    // The context computes with session_options::threads_now() threads, when the session has that.
    void take_threads();

    // Runs f, which decodes from n_past; when it throws, whatever it decoded is removed again, so that n_past and
    // logits still describe the cache.
    template <typename F> auto consistent(F && f) {
        take_threads();
        try {
            return f();
        } catch (...) {
            llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, n_past, -1);
            if (capture) {
                capture->set_probe(false);
            }
            throw;
        }
    }

    void decode(const std::vector<llama_token> & tokens);
    // decode() of a turn: compressed again first when the held compression's decode_compress is due (the one place
    // that rule lives; sequence::decode and answers go through it).
    void decode_turn(const std::vector<llama_token> & tokens);
    // sequence::recompress() whatever the entries held: compresses again over what each head keeps and the cells decoded
    // since, the last n_keep of them kept whole, with room for n_room. Returns false, compressing nothing, while those
    // cells do not outnumber the window or their window's queries are not all recorded (right after a resume).
    bool compress_again(const method_spec & spec, const method_params & params, int32_t n_keep, int32_t n_room);
    // Greedy decoding of up to n tokens through decode_turn (answer() of a sequence that compresses while decoding).
    generation greedy_turn(int32_t n, bool keep_logits);
    bool compresses_while_decoding() const { return how.enabled && how.decode_compress > 0 && !layout.empty(); }

    // Decodes units [from, to) of `in` at n_past: text tokens in batches, images encoded and decoded by libmtmd.
    // Units ending with an image leave no logits (libmtmd computes none): an error unless `may_end_with_image`
    // (a chunk of a chunked prefill, whose logits nobody reads).
    void               eval(const prompt::impl & in, size_t from, size_t to, bool may_end_with_image = false);
    std::vector<float> encode_media(const mtmd_input_chunk * c) const;

    // Greedy decoding (or teacher forcing) through f from n_past: n_past moves past the tokens f decoded and the
    // logits become the last ones computed. The probe, when asked for and present, records every step into out.
    template <typename F> auto steps(std::vector<std::vector<std::vector<float>>> * out, F && f) {
        const bool probe = out != nullptr && capture != nullptr;
        if (probe) {
            capture->set_probe(true);
        }
        auto r = consistent([&] {
            return f(probe ? step_hook([&] { out->push_back(capture->attention_outputs()); }) : step_hook{});
        });
        if (probe) {
            capture->set_probe(false);
        }
        return r;
    }

    void advance(size_t n_decoded);
};

}  // namespace ecokv::llama
