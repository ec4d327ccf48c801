// ecokv-llama internals: llama.cpp's offload options (-ngl, --device, --no-mmproj-offload) as the model and projector
// parameters they become.
#pragma once

#include "ecokv/llama-session.h"

#include <ggml-backend.h>
#include <llama.h>

#include <vector>

namespace ecokv::llama {

// The devices o.devices names, null-terminated as llama_model_params::devices takes them ({nullptr} for "none"), or
// empty for every GPU device. Throws ecokv::error naming an unknown device and listing the known ones.
std::vector<ggml_backend_dev_t> offload_devices(const session_options & o);

// llama_model_default_params() with the offload options; `devices` (offload_devices) must outlive its use.
llama_model_params model_params(const session_options & o, const std::vector<ggml_backend_dev_t> & devices);

// The device of the projector: the first offload device, or null for ggml's first GPU (use_gpu decides).
ggml_backend_dev_t projector_device(const std::vector<ggml_backend_dev_t> & devices);

}  // namespace ecokv::llama
