// Pre-flight check of model and projector files, before llama.cpp's loaders see them (issue 15). llama.cpp reads a
// GGUF's header safely, but trusts much of what it says: a key of the wrong type ends in a GGML_ASSERT, a duplicated
// vocabulary entry in another, a projector tensor of the wrong shape in a crash while mtmd builds its warm-up graph.
// These checks refuse such files with ecokv::error("PATH: <the first problem>").
#pragma once

#include <cstdint>
#include <string>

namespace ecokv::llama {

// A language model: the GGUF header and tensor table (data inside the file), the vocabulary, the hyperparameters
// within sane bounds and, for the architectures ecokv is tested on (llama, qwen2, qwen2vl), every tensor each layer
// needs with the shape the hyperparameters give.
void check_model_gguf(const std::string & path);

// A multimodal projector (clip): the header and tensor table, the type of every key libmtmd reads, and, for the
// projector types ecokv is tested on (mlp, qwen2vl_merger), the vision tower's and projector's tensors with their
// shapes; its output width must be `n_embd_model`, the model's embedding width (0: not checked).
void check_projector_gguf(const std::string & path, int64_t n_embd_model);

}  // namespace ecokv::llama
