// The bundled tiny VLM (models/tiny-vlm.gguf + models/tiny-vlm-mmproj.gguf, trained by vlm/train.py): llama.cpp
// loads it through the real path (arch llama + an mtmd "mlp" projector) and, with the full cache, answers
// held-out generated items whose answers come from the generator (tests/data/tiny-vlm: seeds 0..7 of
// vlm/gen_docs.py, below the training seeds); `ecokv run` given a prompt but no --model uses it, and --image without -p
// gives the question-agnostic prompt (empty context).
#include "test-util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

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

// The model answers about 95% of held-out items exactly (models/tiny-vlm.md), and all 8 of these. (qa-3, "row 3,
// column 1", looked like a miss until `ecokv run` stopped splitting --question at commas.) Exact answers of 1-6
// characters are near impossible by chance, so a broken load path (tokenizer, projector, image placement, RoPE)
// fails this.
TEST(tiny_vlm, answers_held_out_items_with_the_full_cache) {
    temp_dir                dir;
    const std::vector<json> items = held_out_items();
    ASSERT_EQ(items.size(), 8u);
    int         n_exact = 0;
    std::string misses;
    for (const json & item : items) {
        const std::string image = k_items + "/" + item["image"][0].get<std::string>();
        const json        j     = run_json(dir, { "--model", k_models + "/tiny-vlm.gguf", "--mmproj",
                                                  k_models + "/tiny-vlm-mmproj.gguf", "--image", image, "--question",
                                                  item["question"], "-m", "snapkv", "-b", "100000", "-n", "12" });
        ASSERT_TRUE(j.contains("answers")) << item["id"];
        ASSERT_EQ(j["answers"].size(), 1u) << "one question, commas and all";
        EXPECT_EQ(j["prompt_tokens"].get<int>(), 147) << "BOS, 144 image tokens, two newlines (empty context)";
        const std::string answer = j["answers"][0]["text"].get<std::string>();
        if (answer == item["answers"][0].get<std::string>()) {
            ++n_exact;
        } else {
            misses += " " + item["id"].get<std::string>() + ": '" + answer + "'";
        }
    }
    EXPECT_EQ(n_exact, 8) << "misses:" << misses;
}

TEST(tiny_vlm, is_the_default_model_of_run) {
    temp_dir   dir;
    const json j = run_json(dir, { "--image", k_models + "/tiny-vlm-sample.png", "--question", "What is the TOTAL?",
                                   "-m", "snapkv+ecokv", "-b", "32", "-n", "12", "--compare-full" });
    ASSERT_TRUE(j.contains("answers"));
    EXPECT_FALSE(j["answers"][0]["text"].get<std::string>().empty());
    // An F16 cell of this model: 4 layers x 2 KV heads x head_dim 32 x (K + V) x 2 bytes = 1024 bytes.
    EXPECT_EQ(j["kv_bytes_prompt"].get<uint64_t>(), 147u * 1024u);
    EXPECT_EQ(j["kv_bytes_kept"].get<uint64_t>(), 32u * 1024u) << "uniform allocation: 32 entries per head";
}

// `ecokv eval --window 40` works as `ecokv run --window 40` (the capture holds as many window queries as the method
// asks): on held-out items the evaluation's question-agnostic answers are the answers `run --question` gives.
TEST(tiny_vlm, eval_window_40_answers_as_run_does) {
    temp_dir                     dir;
    const std::string            out    = dir / "w40";
    std::vector<std::string>     args   = { "eval", "--model", k_models + "/tiny-vlm.gguf", "--mmproj",
                                            k_models + "/tiny-vlm-mmproj.gguf", "--dataset", "generated", "--data",
                                            k_items, "--methods", "snapkv+ecokv", "--budgets", "64", "--window", "40",
                                            "--mode", "agnostic", "--limit", "2", "-n", "8", "-t", "2", "--out", out };
    const run_result r = run_cli(dir.path().string(), args);
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_EQ(json::parse(read_file(out + "/config.json"))["window"], 40);
    std::istringstream lines(read_file(out + "/results.jsonl"));
    const std::vector<json> items = held_out_items();
    int                     n     = 0;
    for (std::string line; std::getline(lines, line); ++n) {
        const json   rec  = json::parse(line);
        const json & item = items.at(size_t(n));
        ASSERT_EQ(rec["id"], item["id"]);
        const json j = run_json(dir, { "--image", k_items + "/" + item["image"][0].get<std::string>(), "--question",
                                       item["question"], "-m", "snapkv+ecokv", "-b", "64", "--window", "40", "-n", "8" });
        EXPECT_EQ(j["window"].get<int>(), 40);
        std::string answer = j["answers"][0]["text"].get<std::string>();
        answer             = answer.substr(0, answer.find('\n'));
        EXPECT_EQ(rec["prediction"], answer) << item["id"];
    }
    EXPECT_EQ(n, 2);
}

}  // namespace
