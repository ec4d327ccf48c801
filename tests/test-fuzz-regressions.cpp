// Every input a fuzz target crashed on (fuzz/regressions/<target>/, kept once fixed) runs through the same target body
// in the ordinary suite: a clean ecokv::error or nothing, never a crash or another exception. scripts/fuzz.sh runs the
// targets themselves under libFuzzer with ASan and UBSan.
#include "fuzz-input.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

namespace {

using target_fn = int (*)(const uint8_t *, size_t);

const std::map<std::string, target_fn> k_targets = {
    { "fuzz-capture", ecokv::fuzz::capture },           { "fuzz-head-scores", ecokv::fuzz::head_scores },
    { "fuzz-method", ecokv::fuzz::method },             { "fuzz-metric-items", ecokv::fuzz::metric_items },
    { "fuzz-datasets", ecokv::fuzz::datasets },
#ifdef ECOKV_FUZZ_CHAT_REQUEST
    { "fuzz-chat-request", ecokv::fuzz::chat_request }, { "fuzz-entry", ecokv::fuzz::entry },
#endif
};

TEST(fuzz_regressions, every_kept_input_gives_a_clean_result) {
    size_t n = 0;
    for (const auto & dir : std::filesystem::directory_iterator(ECOKV_FUZZ_REGRESSIONS)) {
        const auto it = k_targets.find(dir.path().filename().string());
#ifndef ECOKV_FUZZ_CHAT_REQUEST
        if (dir.path().filename() == "fuzz-chat-request" || dir.path().filename() == "fuzz-entry") {
            continue;  // built without llama.cpp
        }
#endif
        ASSERT_NE(it, k_targets.end()) << "no fuzz target named " << dir.path();
        for (const auto & file : std::filesystem::directory_iterator(dir.path())) {
            std::ifstream        in(file.path(), std::ios::binary);
            std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            EXPECT_NO_THROW(it->second(bytes.data(), bytes.size())) << file.path();
            ++n;
        }
    }
    EXPECT_GE(n, 1u);
}

}  // namespace
