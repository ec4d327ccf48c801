// ecokv tools: what `run` and `eval` share to drive llama.cpp: loading, prompts (text or libmtmd chunks),
// the prefill with the query capture, and sequence state save/restore.
#pragma once

#include "ecokv/llama-adapter.h"

#include <llama.h>
#include <mtmd.h>

#include <memory>
#include <string>
#include <vector>

namespace ecokv::tools {

struct llama_deleter {
    void operator()(llama_model * m) const { llama_model_free(m); }
    void operator()(mtmd_context * c) const { mtmd_free(c); }
    void operator()(mtmd_input_chunks * c) const { mtmd_input_chunks_free(c); }
};
using model_ptr     = std::unique_ptr<llama_model, llama_deleter>;
using projector_ptr = std::unique_ptr<mtmd_context, llama_deleter>;

// Silences llama.cpp and mtmd below errors unless verbose.
void set_llama_verbose(bool verbose);

// Throws ecokv::error naming the file when it is missing or llama.cpp/mtmd cannot load it.
model_ptr     load_model(const std::string & path);
projector_ptr load_projector(const std::string & path, llama_model * model, int32_t n_threads);

// A chat prompt split where the question goes: `context` (template start + context text) is prefilled and
// compressed; each question is followed by `question_suffix` (template end, assistant prefix).
struct prompt_parts {
    std::string context;
    std::string question_suffix;
};
prompt_parts split_prompt(const llama_model * model, const std::string & context);

// What a prefill leaves: the logits for the first new token, the cells and the next position.
struct prefill_result {
    std::vector<float>   first_logits;
    int32_t              n_tokens = 0;  // cells: text tokens + image/audio embeddings
    int32_t              n_past   = 0;  // next position (M-RoPE images advance it by less than their tokens)
    int32_t              n_media  = 0;  // image/audio tokens
    std::vector<uint8_t> modality;      // per cell (0 text, 1 image, 2 audio); empty for a text prompt
    double               seconds  = 0;
};

// `text` with one libmtmd media marker per image at its start, unless it already holds markers.
std::string with_media_markers(std::string text, size_t n_images);

// A tokenized prompt: text tokens, or mtmd chunks when there are images (`text` holds one media marker per image).
class prompt {
  public:
    prompt(llama_model * model, mtmd_context * projector, std::string text, const std::vector<std::string> & images);
    ~prompt();

    int32_t        n_cells() const { return n_cells_; }
    prefill_result prefill(llama_context * ctx) const;

  private:
    llama_model *                                     model_;
    mtmd_context *                                    projector_;
    std::vector<llama_token>                          tokens_;
    std::unique_ptr<mtmd_input_chunks, llama_deleter> chunks_;
    int32_t                                           n_cells_ = 0;
};

// Context parameters for n_cells cells (n_batch up to 2048) and n_threads (0: llama.cpp's default).
llama_context_params context_params(int32_t n_cells, int32_t n_threads);

std::vector<uint8_t> save_state(llama_context * ctx);
void                 restore_state(llama_context * ctx, const std::vector<uint8_t> & state);

}  // namespace ecokv::tools
