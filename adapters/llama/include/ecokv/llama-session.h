// ecokv-llama: the one engine-facing object. A `session` owns a llama.cpp model (and its libmtmd projector) and
// builds prompts; `session::prefill` gives a `sequence`, one conversation's KV cache in its own llama_context, which
// compresses into a smaller `sequence`, decodes greedily, saves and restores `snapshot`s, and measures its fidelity
// to the full cache. `ecokv run`, `ecokv eval`, bench-decode and the server are clients of this API only.
//
// Memory. A session holds the model weights and the projector. A sequence holds one context: its KV cache,
// llama.cpp's compute buffers and, for a prefilled sequence, the captured queries (window rows per layer; every
// prompt token's with full_queries). A prefilled cache has n_cells + n_extra cells (llama.cpp rounds up to 256); a
// compressed one is ragged (patches/llama.cpp): each KV head of each layer holds its kept entries and room for
// n_extra tokens, nothing more. capture() views the cache in place (a copy only of a transposed V, made without flash
// attention, or of a device cache). A snapshot is a host copy of the sequence's state (kept entries only for a
// compressed sequence).
//
// Errors. Everything a user can cause (missing or unreadable files, images the projector cannot take, prompts
// longer than the model's context, contexts llama.cpp cannot allocate, bad method parameters) throws ecokv::error
// with a message naming the file or the limit; nothing is left half-built.
//
// Threads. A session may be shared by threads: its const members are safe to call concurrently (image encoding is
// serialized inside). A sequence belongs to one thread at a time; different sequences of one session may decode
// concurrently. The session must outlive its sequences.
#pragma once

#include "ecokv/compress.h"
#include "ecokv/llama-generate.h"
#include "ecokv/options.h"

#include <llama.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ecokv::llama {

struct model_deleter {
    void operator()(llama_model * m) const { llama_model_free(m); }
};
using model_ptr = std::unique_ptr<llama_model, model_deleter>;

// llama.cpp's and mtmd's log below errors is silenced unless verbose (process-wide).
void set_verbose(bool verbose);

// What -t 0 means: the physical cores of the CPUs this process may run on (its affinity mask, one per set of
// hyperthread siblings), capped by a cgroup v2 CPU quota; as llama.cpp's tools default to the physical cores.
int32_t default_thread_count();

// The engine's options; ecokv/llama-options.h has them as a table with llama.cpp's names.
struct session_options {
    std::string           model_path;               // GGUF model
    std::string           mmproj_path;              // libmtmd projector GGUF, or empty for text only
    int32_t               n_ctx      = 0;           // most cells a sequence holds, prompt and new tokens; 0: the
                                                    // model's training context
    int32_t               n_threads  = 0;           // compute threads; 0: default_thread_count()
    int32_t               n_threads_batch = 0;      // threads of prompt (batch) processing; 0: n_threads
    // When set, the threads of every decode and compression, asked before each one (a server's share of the cores
    // among the requests running now); n_threads and n_threads_batch are then the contexts' first.
    std::function<int32_t()> threads_now;
    // Copies of the projector, so that as many images encode at once (a server's engine lanes); each holds its weights.
    int32_t               n_projectors = 1;
    int32_t               n_batch    = 2048;        // logical batch, capped at the context size
    int32_t               n_ubatch   = 0;           // physical batch; 0: llama.cpp's default
    llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
    ggml_type             type_k     = GGML_TYPE_F16;  // the KV cache's element types (cache_types(); a quantized V
                                                       // needs flash attention)
    ggml_type             type_v     = GGML_TYPE_F16;
    // Dynamic-resolution projectors (Qwen2-VL): resize an image to at most this many tokens (mtmd's
    // image_max_tokens, llama.cpp's --image-max-tokens); 0: the projector's own limit.
    int32_t               image_max_tokens = 0;
    // Offload (docs/gpu.md): layers whose weights and KV cache go to the GPU devices (k_all_layers: every layer and
    // the output; llama.cpp's k_auto_layers fits the layers to free memory, which ecokv does not: auto is all), the
    // devices (llama.cpp's --device: comma-separated names, "none" for none; empty: every GPU device), and whether
    // the projector runs on the first of them.
    static constexpr int32_t k_auto_layers = -1, k_all_layers = -2;
    int32_t               n_gpu_layers   = k_auto_layers;
    std::string           devices;
    bool                  mmproj_offload = true;

    // n_gpu_layers as llama_model_params takes it (-1: every layer and the output).
    int32_t llama_gpu_layers() const { return n_gpu_layers >= 0 ? n_gpu_layers : -1; }
};

// A device ggml can run on, as llama.cpp's --list-devices prints it.
struct device_info {
    std::string name, description;
    uint64_t    total_bytes = 0, free_bytes = 0;
};
// The GPU (and other non-CPU) devices of this build, in ggml's order; empty for a CPU-only build.
std::vector<device_info> list_devices();
// Whether this build can offload layers (llama_supports_gpu_offload: a GPU backend with a device).
bool gpu_offload_supported();

// Where one image chunk's tokens lie in a prompt: cells [first_cell, first_cell + n_rows * n_cols), row-major. For
// M-RoPE projectors the grid is mtmd's; other projectors report only a count, taken as a square grid when it is
// one (LLaVA's ViT patches) and as one row otherwise. Tiling projectors (LLaVA-NeXT, InternVL, Idefics3) make
// several chunks of one image: its tiles, row-major, then the overview of the whole image, the last part.
struct media_grid {
    int32_t first_cell = 0, n_rows = 0, n_cols = 0;
    int32_t image = 0;    // which of the prompt's images
    int32_t part = 0;     // which of its chunks
    int32_t n_parts = 1;  // chunks of that image
};

// A chat prompt split where the question goes: `context` (template start + context text) is prefilled and
// compressed; each question is followed by `question_suffix` (template end, assistant prefix).
struct prompt_parts {
    std::string context;
    std::string question_suffix;
};

// `text` with one libmtmd media marker per image at its start, unless it already holds markers.
std::string with_media_markers(std::string text, size_t n_images);
// libmtmd's media marker: where an image goes in a prompt's text.
std::string media_marker();

// A tokenized prompt: text tokens, or libmtmd chunks when there are images. Made by a session; tied to it.
class prompt {
  public:
    prompt(prompt &&) noexcept;
    prompt & operator=(prompt &&) noexcept;
    ~prompt();

    int32_t                      n_cells() const;   // KV cells: text tokens + image embeddings
    int32_t                      n_media() const;   // image/audio cells
    const std::vector<uint8_t> & modality() const;  // per cell: 0 text, 1 image, 2 audio; empty for text
    const std::vector<media_grid> & images() const;  // per image chunk, in prompt order
    // The prompt as units: a text token is its id, an image is one unit, bit 63 set and a hash of its bytes below.
    // Two prompts that share a prefix of units share the cache of that prefix.
    const std::vector<uint64_t> & units() const;
    int32_t                       cells_before(size_t unit) const;  // cells of units [0, unit); unit <= units().size()

  private:
    friend class session;
    friend class sequence;
    struct impl;
    explicit prompt(std::unique_ptr<impl> p);
    std::unique_ptr<impl> impl_;
};

// The state of a sequence, self-contained: restore it into the same sequence, or resume it in a new one.
struct snapshot {
    std::vector<uint8_t>  state;               // llama_state_seq_get_data of the sequence
    std::vector<uint32_t> layout;              // a compressed cache's kept entries per (layer, KV head), or empty
    // A compressed cache's bookkeeping, so that a resumed one compresses again: the cells each head keeps and their
    // modality (sequence::kept_cells), the cells numbered before those decoded since, and these cells' modality.
    std::vector<std::vector<int32_t>> kept_cells;
    std::vector<std::vector<uint8_t>> kept_modality;
    std::vector<std::vector<float>>   kept_accumulated;  // streaming H2O: their accumulated attention, and of the
                                                         // cells decoded since (the queries recorded folded in)
    int32_t                           cells_seen = 0;
    std::vector<uint8_t>              decoded_modality;
    std::vector<float>    logits;              // distribution of the next token
    bool                  own_logits    = true;  // false: computed on the full cache before compression
    int32_t               n_cells       = 0;   // cells: a compressed cache's label cell and the tokens decoded since
    llama_pos             n_past        = 0;   // next position
    uint64_t              kv_bytes_kept = 0;

    size_t bytes() const {
        size_t n = state.size() + layout.size() * sizeof(uint32_t) + logits.size() * sizeof(float) +
                   decoded_modality.size();
        for (size_t i = 0; i < kept_cells.size(); ++i) {
            n += kept_cells[i].size() * sizeof(int32_t) + (i < kept_modality.size() ? kept_modality[i].size() : 0) +
                 (i < kept_accumulated.size() ? kept_accumulated[i].size() * sizeof(float) : 0);
        }
        return n;
    }
};

// The full cache's answer to one question, kept as the reference of every compressed cache: tokens, the
// distribution each was picked from, and each step's per-layer attention output (the kqv_out probe).
struct reference {
    generation                                   answer;
    std::vector<std::vector<std::vector<float>>> attention;  // [step][layer][n_head * head_dim_v]
};

// A compressed cache's fidelity to the full one, teacher-forced on the reference's tokens.
struct fidelity_report {
    double              agreement = 0;  // greedy agreement
    double              mean_kl   = 0;  // mean KL(full || compressed) of the next-token distributions
    int32_t             n         = 0;  // steps compared (0: nothing to compare; the figures are meaningless)
    std::vector<double> attn_rel_error;  // per layer, mean ||o_c - o_f|| / ||o_f||; empty without a probe
};

// How a compressed sequence was made.
struct compression_info {
    selection sel;
    double    select_seconds  = 0;
    double    rebuild_seconds = 0;
    double    capture_seconds = 0;  // the prefill's K/V made readable (copies from a device)
    uint64_t  bytes_to_host   = 0;  // bytes copied device -> host for the compression: keys, window queries, values
                                    // where the method reads them (0 on the CPU)
};

class sequence;
class batch;

// Whether sequence::compress() can make `c` from a prefilled sequence (one prefill, many compressions): enabled, not
// chunked (a chunked prefill is its own) and never compressing again (the copy has no window queries to do it with).
bool compressible_by_copy(const compression & c);
// Throws ecokv::error when a prompt of n_cells is too short for the method of `c` to compress: it needs more cells than
// its observation window.
void check_prompt_window(int32_t n_cells, const compression & c);

class session {
  public:
    // Loads the model (and projector). Throws ecokv::error naming the file.
    explicit session(const session_options & options);
    // Adopts a model built in memory (tests, benchmarks); text prompts only.
    session(model_ptr model, const session_options & options);
    // Borrows a model that outlives the session; text prompts only.
    session(llama_model & model, const session_options & options);
    ~session();
    session(const session &)             = delete;
    session & operator=(const session &) = delete;

    const llama_model * model() const;
    bool                has_projector() const;
    std::string         description() const;  // llama_model_desc
    int32_t             n_ctx_train() const;
    int32_t             n_ctx() const;  // the most cells a sequence may hold: options().n_ctx, else n_ctx_train()
    const session_options & options() const;

    std::vector<llama_token> tokenize(const std::string & text, bool add_special) const;
    std::string              detokenize(const std::vector<llama_token> & tokens) const;
    // The chat template applied to one user message with the assistant prefix (the text itself without a template).
    std::string              chat_prompt(const std::string & user) const;
    prompt_parts             split_prompt(const std::string & context) const;

    // `text` (BOS added) with images (files) where it holds libmtmd's media markers, one per image
    // (with_media_markers() puts them first).
    prompt make_prompt(const std::string & text, const std::vector<std::string> & images = {}) const;
    // The same with images given as encoded bytes (PNG, JPEG, BMP, GIF); errors name the image by its position.
    prompt make_prompt_from_memory(const std::string & text, const std::vector<std::vector<uint8_t>> & images) const;
    prompt make_prompt(std::vector<llama_token> tokens) const;
    // The chat template applied to a conversation (with the assistant prefix); without a template, the plain format
    // of the bundled tiny VLM (llama-generate.h).
    std::string chat_text(const std::vector<chat_message> & messages) const;
    bool        is_end_of_generation(llama_token token) const;
    // What names this session's caches in a stored entry (ecokv/llama-entry.h): a fingerprint of the model and
    // projector files (their size, first MiB and 16 blocks of their weights; a model built in memory: its metadata),
    // and the engine options that shape the cache ("k=f16 v=f16 layers=4 kv_heads=2 ... fa=auto").
    uint64_t    fingerprint() const;
    std::string cache_shape() const;

    // A turn's prompt with the compression `c` applied: the one entry of every client (docs/architecture.md, "A turn").
    // Units [0, split) of `p` (the context before a question; the whole prompt by default) are prefilled and, when `c`
    // is enabled and they hold more cells than the budget (fewer are kept whole, SPEC §2) or the sequence will compress
    // again (then more than the window), compressed: chunk by chunk when c.chunk > 0 (no KV head ever holds more than the
    // budget plus one chunk), else in one shot and in place. Room is left for the units from `split` on (the question:
    // append() them next; the turn begins with them) and n_extra tokens after. The sequence holds `c`: decode() compresses again every
    // c.decode_compress cells and end_turn() applies c.recompress_slack, recording the window's queries for both.
    sequence prefill(const prompt & p, const compression & c, int32_t n_extra, size_t split = size_t(-1)) const;
    // The kept conversation `s` in a new sequence with room for n_extra more tokens, holding `c` as prefill() does (a
    // compressed snapshot's sequence records its window's queries when `c` compresses again); with probe, its decodes
    // record attention outputs.
    sequence resume(const snapshot & s, const compression & c, int32_t n_extra, bool probe = false) const;

    // The building blocks of prefill(), for what measures the steps apart (analysis, benchmarks, tests).
    // Prefills `p` into a new sequence of p.n_cells() + n_extra cells, capturing the queries `needs` asks for (at
    // least 32 window rows, SPEC §7; nothing when needs.n_window_queries is 0). Throws when the prompt and the new
    // tokens exceed the model's training context.
    // Only the first n_units units of the prompt when given (append() the rest later).
    sequence prefill(const prompt & p, int32_t n_extra, const method_requirements & needs,
                     size_t n_units = size_t(-1)) const;

  private:
    friend class sequence;
    friend class batch;
    uint64_t compute_fingerprint() const;
    // Prefills `p` chunk by chunk so that no KV head ever holds more than the budget plus one chunk (and llama.cpp's
    // padding): chunks of at most n_chunk cells (an image is never split; a chunk not longer than the method's
    // window joins the next one, or the last the one before), the first prefilled and compressed in place, every next
    // one decoded into the room of the compressed cache and the cache compressed again over what each head keeps and
    // the chunk (sequence::extend()). Positions are the prompt's own. Room is left for n_extra new tokens. Only the
    // first n_units units of the prompt. Throws ecokv::error for a chunk not larger than the window.
    sequence prefill_chunked(const prompt & p, int32_t n_chunk, const method_spec & spec, const method_params & params,
                             int32_t n_extra, size_t n_units) const;
    sequence prefill_units(const prompt & p, size_t n_units, int32_t n_extra, int32_t n_batch,
                           const method_requirements & needs) const;
    struct impl;
    std::unique_ptr<impl> impl_;
};

class sequence {
  public:
    sequence(sequence &&) noexcept;
    sequence & operator=(sequence &&) noexcept;
    ~sequence();

    int32_t   n_cells() const;  // cells holding the prompt, or the longest KV head's kept entries
    int32_t   n_held() const;   // n_cells() and the cells decoded since the prompt or the last compression
    llama_pos n_past() const;   // next position (after an M-RoPE image, less than the cells)
    const std::vector<float> & logits() const;  // distribution of the next token
    uint64_t  kv_bytes_allocated() const;  // K and V stores of the context, as allocated
    uint64_t  kv_bytes_kept() const;       // entries held x bytes per entry
    uint64_t  kv_bytes_per_cell() const;   // K + V of one token in every KV head and layer
    uint64_t  kv_bytes_of_cells(int32_t n) const;  // of n cells uncompressed (an iSWA model's windows at most theirs)

    // A prefilled sequence's prompt: cells, image cells, modality, prefill time.
    int32_t                      n_prompt() const;
    int32_t                      n_media() const;
    const std::vector<uint8_t> & modality() const;
    double                       prefill_seconds() const;  // chunked: every chunk's decode, compressions not included

    // The prefill as an ecokv capture (SPEC §7): keys and values are views of the prompt's cells in the cache (tokens
    // decoded since are left out); queries from the capture. Only for a prefilled sequence with a capture.
    const capture_view & capture() const;
    void                 release_capture();

    // Selects with the method and writes the kept entries into a new sequence with room for n_extra tokens, at the
    // prompt's position with the prompt's logits (whatever this sequence decoded since); with probe, its decodes
    // record attention outputs for fidelity(). Only for a prefilled sequence with a capture. Memory peaks at this
    // sequence's cache plus the kept entries plus a new context's compute buffers.
    // Chunked compressions and those that compress again are not made this way (compressible_by_copy()).
    sequence compress(const method_spec & spec, const method_params & params, int32_t n_extra,
                      bool probe = false) const;
    // compress() in this sequence's own context, with room for the n_extra tokens prefill() was given: the full cache
    // is freed as soon as the kept entries are written, so memory peaks at the full cache plus the kept entries.
    void     compress_in_place(const method_spec & spec, const method_params & params);
    // Empty selection for an uncompressed sequence; after a chunked prefill, the last selection and the seconds of
    // every chunk's compression.
    const compression_info & compression() const;
    // Chunked prefill: decodes units [from, to) of `p` into the room of this compressed sequence (made by
    // compress_in_place or extend, nothing decoded since) with their queries captured, then compresses in place again
    // over what each KV head keeps and the new cells, whose last queries are the window, leaving room for n_room
    // tokens. The new cells must fit the room and outnumber the window.
    void extend(const prompt & p, size_t from, size_t to, const method_spec & spec, const method_params & params,
                int32_t n_room);
    // From now on, the queries of every cell decoded are recorded (the last ones kept, as many as the capture holds:
    // the prefill's window, or resume()'s; all of them since the last compression for H2O), for recompress(). Throws
    // without such a capture.
    void record_queries();
    // A conversation's re-compression after an answer (docs/conversations.md): when a KV head of this compressed
    // sequence holds more than budget + slack entries besides the last n_keep cells decoded (the last turn: its
    // message with the chat template's tokens, and the answer), compresses it again in place over what each head
    // holds (kept entries and every cell decoded since the last compression), those n_keep cells kept whole beside
    // the budget and the newest cells' queries as the window; leaves room for n_room tokens. Needs record_queries()
    // since the last compression. Returns whether it compressed (not while too few cells were decoded since the last compression to observe a window).
    bool recompress(const method_spec & spec, const method_params & params, int32_t n_keep, int32_t slack,
                    int32_t n_room);
    // The compression this sequence holds (prefill() or resume() with one; none otherwise) and the compressions it made
    // since, after the first: decode_compress's while decoding and recompress_slack's at the end of turns.
    const ecokv::compression & held_compression() const;
    int32_t                    n_recompressions() const;
    // Ends a turn (its message and answer decoded): when the held compression has a recompress_slack, recompress()s
    // with it, this turn's cells (decoded since prefill() or resume() returned, the question included) kept whole and
    // room for one token. Returns whether it compressed.
    bool end_turn();
    // KV bytes the prefill's context allocated before any compression (the full cache; a chunked prefill's first
    // chunk's context).
    uint64_t kv_bytes_prefilled() const;
    // Cells decoded since the last compression of a compressed sequence (0 for an uncompressed one).
    int32_t n_decoded() const;
    // The cells each (layer, KV head) of a compressed sequence keeps, ascending (the prompt's cells first, then those
    // decoded after it, numbered on); empty when uncompressed.
    const std::vector<std::vector<int32_t>> & kept_cells() const;
    // Since the prefill: the most KV cells any head had allocated at once (llama.cpp's padding included) and the most
    // KV bytes allocated at once (an in-place compression holds the old and new stores together for a moment).
    int32_t  peak_kv_cells() const;
    uint64_t peak_kv_bytes() const;

    // Decodes tokens at n_past; a sequence holding a compression with decode_compress compresses again first when that
    // many cells were decoded since the last compression (as a chunk of a chunked prefill: over what each KV head keeps
    // and those cells, whose last queries are the window, with room for the next decode_compress; the origin moves
    // with it). Here and below, a decode that throws (context full, ...) leaves the sequence as it was before the call.
    void       decode(const std::vector<llama_token> & tokens);
    // Decodes the units of `p` from `from` on at n_past (text and images): a new turn on a kept cache. Nothing when
    // `from` is the end of the prompt.
    void       append(const prompt & p, size_t from);
    // Greedy decoding of up to n tokens from logits() (stops after an end-of-generation token). The last token
    // picked is not decoded: logits() stays the distribution it was picked from; decode it to continue after it.
    generation greedy(int32_t n, bool keep_logits = false);
    // decode(question) when not empty, then greedy(n).
    generation answer(const std::vector<llama_token> & question, int32_t n, bool keep_logits = false);
    // answer() with the distributions and, when the sequence probes (a prefilled one with a capture, or a compressed
    // one made with probe), every step's attention outputs: the reference of fidelity().
    reference  answer_reference(const std::vector<llama_token> & question, int32_t n);
    // decode(question) when not empty, then teacher forcing on the reference's tokens. The first answer token
    // counts only when its distribution was computed on this cache (the question was decoded here).
    fidelity_report fidelity(const std::vector<llama_token> & question, const reference & full);

    // Back to the state right after the prompt, the compression or the resumed snapshot: every token decoded since
    // is removed from the cache (no copy; the cells keep their places).
    void     rewind();
    // Every entry the cache holds (tokens decoded since the prompt included), its layout, position and logits.
    snapshot save() const;
    // Replaces the cache by the snapshot's; it must fit this context. rewind() then comes back to it, and the
    // sequence no longer has a prefill capture (it cannot compress). When llama.cpp rejects the state, the sequence
    // is left empty.
    void     restore(const snapshot & s);

  private:
    friend class session;
    struct impl;
    explicit sequence(std::unique_ptr<impl> p);
    std::unique_ptr<impl> impl_;
};

}  // namespace ecokv::llama
