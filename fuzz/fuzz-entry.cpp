// A stored entry (ecokv/llama-entry.h: what a shared store or Sequence.save() hands back) from hostile bytes: the
// bytes as given (the checksum stops almost all of them), then sealed with their own checksum, so that the parser's
// every length and field check is reached. Only an entry_error may leave.
#include "fuzz-input.h"

#include "ecokv/llama-entry.h"

#include <xxhash.h>

#include <vector>

int ecokv::fuzz::entry(const uint8_t * data, size_t size) {
    std::vector<uint8_t> sealed(data, data + size);
    const uint64_t       sum = XXH3_64bits(data, size);
    sealed.insert(sealed.end(), reinterpret_cast<const uint8_t *>(&sum), reinterpret_cast<const uint8_t *>(&sum) + 8);
    for (const std::span<const uint8_t> bytes : { std::span<const uint8_t>(data, size), std::span<const uint8_t>(sealed) }) {
        try {
            (void) ecokv::llama::decode_entry(bytes);
        } catch (const ecokv::llama::entry_error &) {
        }
    }
    return 0;
}

#ifndef ECOKV_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) { return ecokv::fuzz::entry(data, size); }
#endif
