// The bundled tiny VLM (models/tiny-vlm.gguf + models/tiny-vlm-mmproj.gguf, trained by vlm/train.py): llama.cpp
// loads it through the real path (arch llama + an mtmd "mlp" projector) and, with the full cache, answers
// held-out generated items whose answers come from the generator (tests/data/tiny-vlm: seeds 0..7 of
// vlm/gen_docs.py, below the training seeds); `ecokv run` without --model uses it.
#include "test-util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace {

using namespace ecokv::test;
using json = nlohmann::json;

const std::string k_models = std::string(ECOKV_ROOT) + "/models";
const std::string k_items  = std::string(ECOKV_TEST_DATA) + "/tiny-vlm";

std::vector<json> held_out_items() {
    std::ifstream     in(k_items + "/items.jsonl");
    std::vector<json> items;
    for (std::string line; std::getline(in, line);) {
        items.push_back(json::parse(line));
    }
    return items;
}

json run_json(const temp_dir & dir, std::vector<std::string> args) {
    args.insert(args.begin(), { "run", "--json", "-t", "2" });
    const run_result r = run_cli(dir.path().string(), args);
    EXPECT_EQ(r.code, 0) << describe(r);
    return r.code == 0 ? json::parse(r.out) : json::object();
}

TEST(tiny_vlm, answers_held_out_items_with_the_full_cache) {
    temp_dir                dir;
    const std::vector<json> items = held_out_items();
    ASSERT_EQ(items.size(), 8u);
    for (const json & item : items) {
        const std::string image = k_items + "/" + item["image"][0].get<std::string>();
        const json        j     = run_json(dir, { "--model", k_models + "/tiny-vlm.gguf", "--mmproj",
                                                  k_models + "/tiny-vlm-mmproj.gguf", "--image", image, "--question",
                                                  item["question"], "-m", "snapkv", "-b", "100000", "-n", "12" });
        ASSERT_TRUE(j.contains("answers")) << item["id"];
        EXPECT_EQ(j["prompt_tokens"].get<int>(), 146) << "BOS, 144 image tokens, newline";
        EXPECT_EQ(j["answers"][0]["text"].get<std::string>(), item["answers"][0].get<std::string>())
            << item["id"] << ": " << item["question"];
    }
}

TEST(tiny_vlm, is_the_default_model_of_run) {
    temp_dir   dir;
    const json j = run_json(dir, { "--image", k_models + "/tiny-vlm-sample.png", "--question", "What is the TOTAL?",
                                   "-m", "snapkv+ecokv", "-b", "32", "-n", "12", "--compare-full" });
    ASSERT_TRUE(j.contains("answers"));
    EXPECT_FALSE(j["answers"][0]["text"].get<std::string>().empty());
    EXPECT_LT(j["kv_bytes_kept"].get<uint64_t>(), j["kv_bytes_full"].get<uint64_t>());
}

}  // namespace
