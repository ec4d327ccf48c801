// A capture file (SPEC §7 safetensors) from hostile bytes: opened, validated, then compressed by two methods, so
// that every view the reader accepts is also read in full.
#include "fuzz-input.h"

#include "ecokv/capture.h"
#include "ecokv/compress.h"
#include "ecokv/error.h"

int ecokv::fuzz::capture(const uint8_t * data, size_t size) {
    try {
        const auto           cap = ecokv::capture_file::open(ecokv::fuzz::as_file(data, size));
        ecokv::method_params p;
        p.budget = 8;
        p.window = 2;
        for (const char * method : { "snapkv+ecokv", "adakv+knorm" }) {
            ecokv::compress(cap.view(), ecokv::parse_method(method), p);
        }
    } catch (const ecokv::error &) {
    }
    return 0;
}

#ifndef ECOKV_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) { return ecokv::fuzz::capture(data, size); }
#endif
