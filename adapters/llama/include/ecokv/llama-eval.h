// ecokv-llama-eval: the evaluation runner's engine (ecokv/eval-runner.h) on a llama.cpp session. Its own target
// (ecokv::llama-eval), so that the adapter's users get no datasets, metrics or tokenizers.
#pragma once

#include "ecokv/eval-runner.h"
#include "ecokv/llama-session.h"

#include <memory>

namespace ecokv::llama {

// An engine over `s` (which must outlive it): an item's prompt is its context and question through the chat
// template; images come first unless the context places them. A compression with a chunk gives its answer from its
// own chunked prefill (session::prefill_chunked); the full cache stays the reference.
std::unique_ptr<eval_engine> make_eval_engine(const session & s);

}  // namespace ecokv::llama
