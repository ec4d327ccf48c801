// ecokv-llama: the evaluation runner's engine (ecokv/eval-runner.h) on a llama.cpp session.
#pragma once

#include "ecokv/eval-runner.h"
#include "ecokv/llama-session.h"

#include <memory>

namespace ecokv::llama {

// An engine over `s` (which must outlive it): an item's prompt is its context and question through the chat
// template; images come first unless the context places them. With n_chunk > 0, every compressed answer comes from
// its own chunked prefill (session::prefill_chunked) of n_chunk-cell chunks; the full cache stays the reference.
std::unique_ptr<eval_engine> make_eval_engine(const session & s, int32_t n_chunk = 0);

}  // namespace ecokv::llama
