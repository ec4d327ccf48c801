// session, prompt and sequence (ecokv/llama-session.h): the recipe every client used to spell out, written once.
#include "ecokv/llama-session.h"

#include "ecokv/error.h"
#include "ecokv/llama-adapter.h"
#include "gguf-check.h"
#include "kv-store.h"

#include <mtmd-helper.h>
#include <mtmd.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>

namespace ecokv::llama {

namespace {

bool g_verbose = false;

void log_filter(ggml_log_level level, const char * text, void *) {
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

struct mtmd_deleter {
    void operator()(mtmd_context * c) const { mtmd_free(c); }
    void operator()(mtmd_input_chunks * c) const { mtmd_input_chunks_free(c); }
    void operator()(mtmd_bitmap * b) const { mtmd_bitmap_free(b); }
};

constexpr uint64_t k_image_unit = uint64_t(1) << 63;  // prompt::units(): an image, its content hash below

// FNV-1a over an image's bytes: two requests sending the same image give the same prompt unit.
uint64_t image_hash(const std::vector<uint8_t> & bytes) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint8_t b : bytes) {
        h = (h ^ b) * 0x100000001b3ull;
    }
    return h & (k_image_unit - 1);
}

// A bad image, by its index among the prompt's images.
struct image_error : error {
    size_t index;
    image_error(size_t i, const std::string & what) : error("image " + std::to_string(i + 1) + ": " + what), index(i) {}
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Prompts of at most 2048 cells go in one batch; larger ones in batches of options.n_batch.
llama_context_params context_params(const session_options & o, int32_t n_cells) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx                = uint32_t(n_cells);
    p.n_batch              = uint32_t(std::min(n_cells, o.n_batch));
    if (o.n_ubatch > 0) {
        p.n_ubatch = uint32_t(std::min(o.n_ubatch, int32_t(p.n_batch)));
    }
    p.n_seq_max       = 1;
    p.flash_attn_type = o.flash_attn;
    if (o.n_threads > 0) {
        p.n_threads = p.n_threads_batch = o.n_threads;
    }
    return p;
}

context_ptr new_context(const llama_model * model, const llama_context_params & p) {
    context_ptr ctx(llama_init_from_model(const_cast<llama_model *>(model), p));
    if (!ctx) {
        throw error("cannot create a context of " + std::to_string(p.n_ctx) + " cells");
    }
    return ctx;
}

// Replaces the context's cache by the snapshot's. A compressed snapshot first gets a ragged cache of its layout, with
// room for n_room tokens besides the ones it holds. Checked before the cache is cleared where it can be; when llama.cpp still
// rejects the state the cache is left empty.
void write_state(llama_context * ctx, const snapshot & s, int32_t n_room) {
    const uint32_t n_cells = state_cell_count(s.state);
    if (!s.layout.empty()) {
        if (int64_t(s.layout.size()) != int64_t(llama_model_n_layer(llama_get_model(ctx))) * llama_model_n_head_kv(llama_get_model(ctx))) {
            throw error("the snapshot's layout does not match the model");
        }
        if (n_cells == 0 ||
            !llama_kv_set_ragged(ctx, s.layout.data(), n_cells - 1 + uint32_t(n_room), 0, nullptr, nullptr)) {
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

void set_verbose(bool verbose) {
    g_verbose = verbose;
    llama_log_set(log_filter, nullptr);
    mtmd_helper_log_set(log_filter, nullptr);
}

std::string media_marker() { return mtmd_default_marker(); }

std::string with_media_markers(std::string text, size_t n_images) {
    if (n_images == 0 || text.find(mtmd_default_marker()) != std::string::npos) {
        return text;
    }
    std::string markers;
    for (size_t i = 0; i < n_images; ++i) {
        markers += std::string(mtmd_default_marker()) + "\n";
    }
    return markers + text;
}

// ---- prompt ----------------------------------------------------------------------------------------------------

namespace {

// An M-RoPE image's last token sits at (row, column) = (rows - 1, columns - 1) of its grid, all at one temporal
// position; other projectors place image tokens one after the other and say nothing of a grid.
media_grid image_grid(const mtmd_image_tokens * t, int32_t first_cell) {
    const auto n = int32_t(mtmd_image_tokens_get_n_tokens(t));
    if (n == 0) {
        return { first_cell, 0, 0 };
    }
    const mtmd_decoder_pos last = mtmd_image_tokens_get_decoder_pos(t, 0, size_t(n - 1));
    if (n > 1 && last.t == 0) {
        return { first_cell, int32_t(last.y) + 1, int32_t(last.x) + 1 };
    }
    const auto side = int32_t(std::lround(std::sqrt(double(n))));
    return side * side == n ? media_grid{ first_cell, side, side } : media_grid{ first_cell, 1, n };
}

}  // namespace

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

prompt::prompt(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
prompt::prompt(prompt &&) noexcept             = default;
prompt & prompt::operator=(prompt &&) noexcept = default;
prompt::~prompt()                              = default;

int32_t prompt::n_cells() const { return impl_->n_cells; }
const std::vector<uint64_t> & prompt::units() const { return impl_->units; }
int32_t prompt::cells_before(size_t unit) const { return impl_->cells.at(unit); }
int32_t prompt::n_media() const { return impl_->n_media; }
const std::vector<uint8_t> & prompt::modality() const { return impl_->modality; }
const std::vector<media_grid> & prompt::images() const { return impl_->images; }

namespace {

// The capture header of a chunk: the model's dimensions and, per layer, the last n_new rows `capture` recorded (at
// most its window) as window queries; keys and values are the caller's (per-head candidates).
capture_view chunk_capture(const llama_model * model, const query_capture & capture, int32_t n_new) {
    capture_view cap;
    cap.n_layers   = llama_model_n_layer(model);
    cap.n_heads    = llama_model_n_head(model);
    cap.n_kv_heads = llama_model_n_head_kv(model);
    for (int32_t il = 0; il < cap.n_layers; ++il) {
        tensor_view q   = capture.queries(il);
        const int64_t n = std::min<int64_t>(q.ne[1], n_new);
        q.data          = q.row(q.ne[1] - n);
        q.ne[1]         = n;
        cap.layers.push_back({ {}, {}, q, {} });
        cap.head_dim  = int32_t(q.ne[0]);
        cap.n_queries = int32_t(n);
    }
    char desc[256] = {};
    llama_model_desc(model, desc, sizeof desc);
    cap.model = desc;
    return cap;
}

}  // namespace

// ---- session ---------------------------------------------------------------------------------------------------

struct session::impl {
    session_options                             opts;
    model_ptr                                   owned;          // null for a borrowed model
    llama_model *                               model = nullptr;
    std::unique_ptr<mtmd_context, mtmd_deleter> projector;
    mutable std::mutex                          mtmd_mutex;  // libmtmd's clip context is not thread-safe
};

namespace {

model_ptr load_model(const std::string & path) {
    if (!std::filesystem::is_regular_file(path)) {
        throw error(path + ": no such model file");
    }
    check_model_gguf(path);
    llama_backend_init();
    model_ptr model(llama_model_load_from_file(path.c_str(), llama_model_default_params()));
    if (!model) {
        throw error(path + ": cannot load the model (not a GGUF llama.cpp 0.5.0 can read?)");
    }
    return model;
}

std::unique_ptr<mtmd_context, mtmd_deleter> load_projector(const std::string & path, const llama_model * model,
                                                           int32_t n_threads, int32_t image_max_tokens) {
    if (!std::filesystem::is_regular_file(path)) {
        throw error(path + ": no such mmproj file");
    }
    check_projector_gguf(path, llama_model_n_embd(model));
    mtmd_context_params mp = mtmd_context_params_default();
    mp.use_gpu = mp.print_timings = mp.warmup = false;
    if (image_max_tokens > 0) {
        mp.image_max_tokens = image_max_tokens;
    }
    if (n_threads > 0) {
        mp.n_threads = n_threads;
    }
    std::unique_ptr<mtmd_context, mtmd_deleter> p(mtmd_init_from_file(path.c_str(), model, mp));
    if (!p) {
        throw error(path + ": cannot load the projector (corrupt, or not made for this model?)");
    }
    return p;
}

}  // namespace

session::session(const session_options & options) : impl_(std::make_unique<impl>()) {
    impl_->opts  = options;
    impl_->owned = load_model(options.model_path);
    impl_->model = impl_->owned.get();
    if (!options.mmproj_path.empty()) {
        impl_->projector = load_projector(options.mmproj_path, impl_->model, options.n_threads,
                                          options.image_max_tokens);
    }
}

session::session(model_ptr model, const session_options & options) : impl_(std::make_unique<impl>()) {
    if (!model) {
        throw error("session: no model");
    }
    impl_->opts  = options;
    impl_->owned = std::move(model);
    impl_->model = impl_->owned.get();
}

session::session(llama_model & model, const session_options & options) : impl_(std::make_unique<impl>()) {
    impl_->opts  = options;
    impl_->model = &model;
}

session::~session() = default;

const llama_model *     session::model() const { return impl_->model; }
bool                    session::has_projector() const { return impl_->projector != nullptr; }
int32_t                 session::n_ctx_train() const { return llama_model_n_ctx_train(impl_->model); }
const session_options & session::options() const { return impl_->opts; }

std::string session::description() const {
    char desc[256] = {};
    llama_model_desc(impl_->model, desc, sizeof desc);
    return desc;
}

std::vector<llama_token> session::tokenize(const std::string & text, bool add_special) const {
    return llama::tokenize(impl_->model, text, add_special);
}

std::string session::detokenize(const std::vector<llama_token> & tokens) const {
    return llama::detokenize(impl_->model, tokens);
}

std::string session::chat_prompt(const std::string & user) const { return llama::chat_prompt(impl_->model, user); }

std::string session::chat_text(const std::vector<chat_message> & messages) const {
    return llama::chat_text(impl_->model, messages);
}

bool session::is_end_of_generation(llama_token token) const {
    return llama_vocab_is_eog(llama_model_get_vocab(impl_->model), token);
}

prompt_parts session::split_prompt(const std::string & context) const {
    const std::string marker   = "\x01" "ECOKV_QUESTION" "\x01";
    const std::string rendered = chat_prompt(context + "\n" + marker);
    const size_t      at       = rendered.find(marker);
    if (at == std::string::npos) {
        return { context + "\n", "" };
    }
    return { rendered.substr(0, at), rendered.substr(at + marker.size()) };
}

prompt session::make_prompt(std::vector<llama_token> tokens) const {
    auto p     = std::make_unique<prompt::impl>();
    p->n_cells = int32_t(tokens.size());
    p->units.assign(tokens.begin(), tokens.end());
    for (int32_t i = 0; i <= p->n_cells; ++i) {
        p->cells.push_back(i);
    }
    p->tokens = std::move(tokens);
    return prompt(std::move(p));
}

prompt session::make_prompt(const std::string & text, const std::vector<std::string> & images) const {
    if (!images.empty() && !impl_->projector) {
        throw error("images need a projector (--mmproj)");
    }
    std::vector<std::vector<uint8_t>> bytes;
    for (const std::string & path : images) {
        std::ifstream in(path, std::ios::binary);
        if (!in || std::filesystem::is_directory(path)) {
            throw error(path + ": cannot read the image");
        }
        bytes.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    try {
        return make_prompt_from_memory(text, bytes);
    } catch (const image_error & e) {
        throw error(images[e.index] + std::string(e.what()).substr(std::string(e.what()).find(':')));
    }
}

prompt session::make_prompt_from_memory(const std::string & text, const std::vector<std::vector<uint8_t>> & images) const {
    if (images.empty()) {
        return make_prompt(tokenize(text, true));
    }
    if (!impl_->projector) {
        throw error("images need a projector (--mmproj)");
    }
    const std::string marker    = mtmd_default_marker();
    size_t            n_markers = 0;
    for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + marker.size())) {
        ++n_markers;
    }
    if (n_markers != images.size()) {  // e.g. a literal marker in a question
        throw error("the prompt holds " + std::to_string(n_markers) + " media markers (" + marker + ") for " +
                    std::to_string(images.size()) + (images.size() == 1 ? " image" : " images"));
    }
    const std::lock_guard<std::mutex>                         lock(impl_->mtmd_mutex);
    std::vector<std::unique_ptr<mtmd_bitmap, mtmd_deleter>>   bitmaps;
    std::vector<const mtmd_bitmap *>                          ptrs;
    std::vector<uint64_t>                                     hashes;
    for (size_t i = 0; i < images.size(); ++i) {
        if (images[i].empty()) {
            throw image_error(i, "empty image");
        }
        bitmaps.emplace_back(mtmd_helper_bitmap_init_from_buf(impl_->projector.get(), images[i].data(),
                                                              images[i].size(), false,
                                                              mtmd_helper_init_opt_default()).bitmap);
        if (!bitmaps.back()) {
            throw image_error(i, "cannot decode the image (not a whole PNG, JPEG, BMP or GIF, or too large to decode)");
        }
        ptrs.push_back(bitmaps.back().get());
        hashes.push_back(image_hash(images[i]));
    }
    auto p = std::make_unique<prompt::impl>();
    p->chunks.reset(mtmd_input_chunks_init());
    const mtmd_input_text input{ text.c_str(), text.size(), true, true };
    if (const int32_t rc = mtmd_tokenize(impl_->projector.get(), p->chunks.get(), &input, ptrs.data(), ptrs.size());
        rc != 0) {
        throw error(rc == 1 ? "the prompt's media markers do not match the number of images"
                            : impl_->opts.mmproj_path + ": an image could not be preprocessed for this projector");
    }
    size_t n_images = 0;
    for (size_t i = 0; i < mtmd_input_chunks_size(p->chunks.get()); ++i) {
        const mtmd_input_chunk * c    = mtmd_input_chunks_get(p->chunks.get(), i);
        const auto               type = mtmd_input_chunk_get_type(c);
        const uint8_t m = type == MTMD_INPUT_CHUNK_TYPE_TEXT ? 0 : type == MTMD_INPUT_CHUNK_TYPE_IMAGE ? 1 : 2;
        const size_t  n = mtmd_input_chunk_get_n_tokens(c);
        if (m == 0) {
            size_t              n_text = 0;
            const llama_token * text   = mtmd_input_chunk_get_tokens_text(c, &n_text);
            for (size_t t = 0; t < n_text; ++t) {
                p->cells.push_back(int32_t(p->modality.size() + t));
                p->units.push_back(uint64_t(text[t]));
            }
        } else {  // one unit per image, named by its content
            if (m == 1) {
                p->images.push_back(image_grid(mtmd_input_chunk_get_tokens_image(c), int32_t(p->modality.size())));
            }
            p->cells.push_back(int32_t(p->modality.size()));
            p->units.push_back(k_image_unit | (n_images < hashes.size() ? hashes[n_images++] : 0));
        }
        p->modality.insert(p->modality.end(), n, m);
        p->n_media += m != 0 ? int32_t(n) : 0;
    }
    p->cells.push_back(int32_t(p->modality.size()));
    p->n_cells = int32_t(mtmd_helper_get_n_tokens(p->chunks.get()));
    return prompt(std::move(p));
}

// ---- sequence --------------------------------------------------------------------------------------------------

struct sequence::impl {
    const session::impl *          s = nullptr;
    llama_context_params           cparams{};  // of this context (compressed contexts share the V layout)
    std::unique_ptr<query_capture> capture;    // the prefill's queries (and probe), or a probe, or none
    context_ptr                    ctx;
    mutable std::unique_ptr<prefill_state> state;  // views of the prefilled cache, made on demand
    bool                           prefilled = false;

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
    int32_t                           peak_cells = 0;
    uint64_t                          peak_bytes = 0;

    int32_t              n_prompt = 0, n_media = 0;
    std::vector<uint8_t> modality;
    double               prefill_s = 0;
    // Where rewind() comes back to: after the prompt, the compression or the restored snapshot. A compressed
    // sequence starts from the prompt's, whatever the full one decoded since.
    llama_pos            origin_n_past = 0;
    std::vector<float>   origin_logits;
    bool                 origin_own = true;

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
                              int32_t n_room, query_capture * observer, bool in_place) const {
        return naming_model([&] { return compress_context(s->model, st, spec, params, n_room, cparams, observer, in_place); });
    }

    const prefill_state & prefill() const {
        if (!prefilled || !capture) {
            throw error("the sequence has no prefill capture (prefill it with method requirements to compress it)");
        }
        if (!state) {
            state = std::make_unique<prefill_state>(ctx.get(), *capture, modality, n_prompt, origin_n_past);
        }
        return *state;
    }

    // Becomes the compressed cache `cc` of the prompt of `full` (which may be this very sequence).
    void become_compressed(const impl & full, compressed_cache && cc) {
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
        kept_cells.clear();
        kept_modality.clear();
        for (const auto & layer : cc.sel.layers) {
            for (const head_selection & h : layer) {
                kept_cells.push_back(h.kept);
                if (!full.modality.empty()) {
                    auto & m = kept_modality.emplace_back();
                    for (int32_t c : h.kept) {
                        m.push_back(full.modality[size_t(c)]);
                    }
                }
            }
        }
        comp = { std::move(cc.sel), cc.select_seconds, cc.rebuild_seconds };
    }

    // KV cells per head as allocated: the usual cache's cells, or a ragged one's longest head with its room.
    int32_t head_cells() const {
        if (layout.empty()) {
            return int32_t(llama::kv_bytes_allocated(ctx.get()) / llama::kv_bytes_per_cell(ctx.get()));
        }
        return int32_t(*std::max_element(layout.begin(), layout.end())) + 1 + n_extra;
    }

    // Records the memory held now, plus `transient` bytes held a moment before together with it.
    void note_peak(uint64_t transient = 0) {
        peak_cells = std::max(peak_cells, head_cells());
        peak_bytes = std::max(peak_bytes, llama::kv_bytes_allocated(ctx.get()) + transient);
    }

    // Runs f, which decodes from n_past; when it throws, whatever it decoded is removed again, so that n_past and
    // logits still describe the cache.
    template <typename F> auto consistent(F && f) {
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

    void decode(const std::vector<llama_token> & tokens) {
        logits     = consistent([&] { return llama::decode(ctx.get(), tokens, n_past); });
        n_past    += llama_pos(tokens.size());
        own_logits = true;
    }

    // Decodes units [from, to) of `in` at n_past: text tokens in batches, images encoded and decoded by libmtmd.
    // Units ending with an image leave no logits (libmtmd computes none): an error unless `may_end_with_image`
    // (a chunk of a chunked prefill, whose logits nobody reads).
    void eval(const prompt::impl & in, size_t from, size_t to, bool may_end_with_image = false) {
        if (!in.chunks) {
            decode(std::vector<llama_token>(in.tokens.begin() + ptrdiff_t(from), in.tokens.begin() + ptrdiff_t(to)));
            return;
        }
        const llama_pos start      = n_past;
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
                if (!s->projector) {
                    throw error("an image prompt needs a session with a projector");
                }
                const std::lock_guard<std::mutex> lock(s->mtmd_mutex);
                llama_pos                         next = n_past;
                if (mtmd_helper_eval_chunk_single(s->projector.get(), ctx.get(), c, n_past, 0,
                                                  int32_t(llama_n_batch(ctx.get())), true, &next) != 0) {
                    throw error("evaluating an image of the prompt failed (context full?)");
                }
                n_past     = next;
                image_last = true;
            }
            if (image_last && !may_end_with_image) {  // libmtmd computes no logits for image embeddings: this throws
                logits     = last_logits(ctx.get());
                own_logits = true;
            }
        } catch (...) {  // as decode(): nothing of this call stays
            llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, start, -1);
            n_past = start;
            throw;
        }
    }

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

    void advance(size_t n_decoded) {
        if (n_decoded > 0) {
            logits     = last_logits(ctx.get());
            own_logits = true;
        }
        n_past += llama_pos(n_decoded);
    }
};

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
    if (int64_t(n_cells) + n_extra > n_ctx_train()) {
        throw error("prompt of " + std::to_string(n_cells) + " tokens plus " + std::to_string(n_extra) +
                    " new ones exceeds the model's context of " + std::to_string(n_ctx_train()));
    }
    auto q     = std::make_unique<sequence::impl>();
    q->s       = impl_.get();
    q->cparams = context_params(impl_->opts, n_cells + n_extra);
    q->cparams.n_batch = std::max(q->cparams.n_batch, uint32_t(std::min(n_batch, impl_->opts.n_batch)));
    llama_context_params pp = q->cparams;
    if (needs.n_window_queries > 0 || needs.full_queries) {
        // At least 32 window rows, as a capture file must hold (SPEC §7).
        q->capture = std::make_unique<query_capture>(model(), std::max(32, needs.n_window_queries), needs.full_queries);
        q->capture->attach(pp);
    }
    q->ctx = new_context(model(), pp);

    const auto           t0 = std::chrono::steady_clock::now();
    const prompt::impl & in = *p.impl_;
    q->eval(in, 0, n_units, n_units < p.units().size());
    q->prefill_s = seconds_since(t0);
    if (q->capture) {
        q->capture->set_active(false);
    }
    q->prefilled     = true;
    q->origin_n_past = q->n_past;
    q->origin_logits = q->logits;
    q->n_cells = q->n_prompt = n_cells;
    q->n_extra               = n_extra;
    if (!in.modality.empty()) {
        q->modality.assign(in.modality.begin(), in.modality.begin() + n_cells);
        q->n_media = int32_t(std::count_if(q->modality.begin(), q->modality.end(), [](uint8_t m) { return m != 0; }));
    }
    q->note_peak();
    return sequence(std::move(q));
}

namespace {

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
    if (int64_t(p.cells_before(n_units)) + n_extra > n_ctx_train()) {
        throw error("prompt of " + std::to_string(p.cells_before(n_units)) + " tokens plus " +
                    std::to_string(n_extra) + " new ones exceeds the model's context of " +
                    std::to_string(n_ctx_train()));
    }
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

sequence session::resume(const snapshot & s, int32_t n_extra, bool probe) const {
    auto q            = std::make_unique<sequence::impl>();
    q->s              = impl_.get();
    q->cparams        = context_params(impl_->opts, s.n_cells + n_extra);
    q->n_cells        = s.n_cells;
    q->n_extra        = n_extra;
    q->kv_kept        = s.kv_bytes_kept;
    llama_context_params cp = q->cparams;
    if (probe) {
        q->capture = std::make_unique<query_capture>(model(), 1, false);
        q->capture->set_active(false);
        q->capture->attach(cp);
    }
    q->ctx = new_context(model(), cp);
    sequence out(std::move(q));
    out.restore(s);
    return out;
}

int32_t                    sequence::n_cells() const { return impl_->n_cells; }
llama_pos                  sequence::n_past() const { return impl_->n_past; }
const std::vector<float> & sequence::logits() const { return impl_->logits; }
int32_t                    sequence::n_prompt() const { return impl_->n_prompt; }
int32_t                    sequence::n_media() const { return impl_->n_media; }
const std::vector<uint8_t> & sequence::modality() const { return impl_->modality; }
double                     sequence::prefill_seconds() const { return impl_->prefill_s; }
const compression_info &   sequence::compression() const { return impl_->comp; }

uint64_t sequence::kv_bytes_per_cell() const { return llama::kv_bytes_per_cell(impl_->ctx.get()); }

uint64_t sequence::kv_bytes_allocated() const { return llama::kv_bytes_allocated(impl_->ctx.get()); }

uint64_t sequence::kv_bytes_kept() const {
    return impl_->kv_kept ? impl_->kv_kept : uint64_t(impl_->n_cells) * kv_bytes_per_cell();
}

const capture_view & sequence::capture() const { return impl_->prefill().view(); }

void sequence::release_capture() { impl_->state.reset(); }

void sequence::check_window(const method_spec & spec, const method_params & params) const {
    if (const int32_t window = method_window(spec, params); impl_->n_prompt <= window) {
        throw error("the prompt has " + std::to_string(impl_->n_prompt) + (impl_->n_prompt == 1 ? " token" : " tokens") +
                    "; " + spec.name() + " needs more than its observation window of " + std::to_string(window));
    }
}

sequence sequence::compress(const method_spec & spec, const method_params & params, int32_t n_extra, bool probe) const {
    check_window(spec, params);
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
    check_window(spec, params);
    const uint64_t   before = kv_bytes_allocated();
    compressed_cache cc     = impl_->compress(impl_->prefill(), spec, params, impl_->n_extra, nullptr, true);
    impl_->become_compressed(*impl_, std::move(cc));
    impl_->note_peak(before);  // the full cache and the kept entries, while these were written
}

const std::vector<std::vector<int32_t>> & sequence::kept_cells() const { return impl_->kept_cells; }
int32_t                                   sequence::peak_kv_cells() const { return impl_->peak_cells; }
uint64_t                                  sequence::peak_kv_bytes() const { return impl_->peak_bytes; }

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
        q.eval(*p.impl_, from, to, to < p.units().size());
    }
    q.prefill_s += seconds_since(t_eval);
    q.note_peak();

    // The candidates: each head's kept cells, then the new ones, whose last queries are the window.
    const ragged_candidates cand(q.ctx.get(), q.layout, q.n_extra, n_new);
    capture_view            cap = chunk_capture(q.s->model, *q.capture, n_new);
    cap.heads                   = cand.heads();
    cap.head_dim_v              = int32_t(cap.heads[0].values.ne[0]);
    for (size_t i = 0; i < cap.heads.size(); ++i) {
        for (int32_t c = 0; c < n_new; ++c) {
            q.kept_cells[i].push_back(first + c);
        }
        if (!p.modality().empty()) {
            std::vector<uint8_t> & m = q.kept_modality[i];
            m.insert(m.end(), p.modality().begin() + first, p.modality().begin() + first + n_new);
            cap.heads[i].modality = m;
        }
        cap.n_tokens = std::max(cap.n_tokens, int32_t(q.kept_cells[i].size()));
    }
    compression_info info;
    auto             t0 = std::chrono::steady_clock::now();
    info.sel            = q.naming_model([&] { return ecokv::compress(cap, spec, params, { int32_t(q.cparams.n_threads) }); });
    info.select_seconds = seconds_since(t0);
    t0                  = std::chrono::steady_clock::now();
    const uint64_t before = kv_bytes_allocated();
    make_ragged(q.ctx.get(), cap, info.sel, n_room, q.n_past - 1);
    info.rebuild_seconds = seconds_since(t0);

    q.n_extra = n_room;
    q.layout  = ragged_layout(info.sel);
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
    info.select_seconds += q.comp.select_seconds;  // every chunk's compression
    info.rebuild_seconds += q.comp.rebuild_seconds;
    q.comp = std::move(info);
    q.note_peak(before);
    release_free_heap();
}

void sequence::decode(const std::vector<llama_token> & tokens) { impl_->decode(tokens); }

void sequence::append(const prompt & p, size_t from) {
    if (from > p.units().size()) {
        throw error("append: the prompt has " + std::to_string(p.units().size()) + " units, not " + std::to_string(from));
    }
    impl_->eval(*p.impl_, from, p.units().size());
}

generation sequence::greedy(int32_t n, bool keep_logits) {
    return answer({}, n, keep_logits);
}

generation sequence::answer(const std::vector<llama_token> & question, int32_t n, bool keep_logits) {
    if (!question.empty()) {
        impl_->decode(question);
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
    impl_->n_cells        = s.layout.empty() ? s.n_cells : int32_t(*std::max_element(s.layout.begin(), s.layout.end()));
    impl_->kv_kept        = s.kv_bytes_kept;
    impl_->logits         = impl_->origin_logits = s.logits;
    impl_->own_logits     = impl_->origin_own = s.own_logits;
    impl_->n_past         = impl_->origin_n_past = s.n_past;
}

void sequence::rewind() {
    if (!llama_memory_seq_rm(llama_get_memory(impl_->ctx.get()), 0, impl_->origin_n_past, -1)) {
        throw error("llama.cpp cannot remove the decoded tokens of this sequence");
    }
    impl_->n_past     = impl_->origin_n_past;
    impl_->logits     = impl_->origin_logits;
    impl_->own_logits = impl_->origin_own;
}

}  // namespace ecokv::llama
