// SparseMM's head-score JSON from hostile bytes.
#include "fuzz-input.h"

#include "ecokv/error.h"
#include "io/head-scores.h"

int ecokv::fuzz::head_scores(const uint8_t * data, size_t size) {
    try {
        ecokv::read_head_scores(ecokv::fuzz::as_file(data, size), 2, 4);
    } catch (const ecokv::error &) {
    }
    return 0;
}

#ifndef ECOKV_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) { return ecokv::fuzz::head_scores(data, size); }
#endif
