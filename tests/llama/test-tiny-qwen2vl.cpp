// The bundled Qwen2-VL-style tiny VLM (models/tiny-qwen2vl.gguf + models/tiny-qwen2vl-mmproj.gguf, trained by
// vlm/train_qwen2vl.py): llama.cpp loads it through the real Qwen2-VL path (arch qwen2vl, M-RoPE, an mtmd
// qwen2vl_merger projector with dynamic resolution) and, with the full cache, answers held-out generated items whose
// answers come from the generator (tests/data/tiny-qwen2vl: seeds 0..7 of vlm/gen_pages.py, the first items of the
// model card's evaluation set, below the training seeds).
#include "test-util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace {

using namespace ecokv::test;
using json = nlohmann::json;

const std::string k_models = std::string(ECOKV_ROOT) + "/models";
const std::string k_items  = std::string(ECOKV_TEST_DATA) + "/tiny-qwen2vl";
const std::string k_model  = k_models + "/tiny-qwen2vl.gguf";
const std::string k_mmproj = k_models + "/tiny-qwen2vl-mmproj.gguf";

constexpr int k_cell_bytes = 4 * 2 * 32 * 2 * 2;  // 4 layers x 2 KV heads x head_dim 32 x (K + V) x F16
constexpr int k_text_tokens = 5;                  // BOS, <|vision_start|>, <|vision_end|>, two newlines

std::vector<json> held_out_items() {
    std::ifstream     in(k_items + "/items.jsonl");
    std::vector<json> items;
    for (std::string line; std::getline(in, line);) {
        items.push_back(json::parse(line));
    }
    return items;
}

// A PNG's width and height, from its IHDR chunk (bytes 16..23, big-endian), read without an image library.
std::pair<int, int> png_size(const std::string & path) {
    const std::string bytes = read_file(path);
    auto              be32  = [&](size_t at) {
        int v = 0;
        for (size_t i = 0; i < 4; ++i) {
            v = v << 8 | static_cast<unsigned char>(bytes.at(at + i));
        }
        return v;
    };
    return { be32(16), be32(20) };
}

json run_json(const temp_dir & dir, std::vector<std::string> args) {
    args.insert(args.begin(), { "run", "--json", "-t", "2", "--model", k_model, "--mmproj", k_mmproj });
    const run_result r = run_cli(dir.path().string(), args);
    EXPECT_EQ(r.code, 0) << describe(r);
    return r.code == 0 ? json::parse(r.out) : json::object();
}

// One image token per 8x8 pixels (4-pixel ViT patches merged 2x2): the page sizes are multiples of 8, so mtmd keeps
// them. Exact answers of 1-6 characters are near impossible by chance, so a broken load path (M-RoPE positions, the
// merger's order, the vision control tokens) fails this; the model answers 97.4% of the 500 held-out questions exactly
// (models/tiny-qwen2vl.md), and all 8 of these.
TEST(tiny_qwen2vl, answers_held_out_items_with_the_full_cache) {
    temp_dir                dir;
    const std::vector<json> items = held_out_items();
    ASSERT_EQ(items.size(), 8u);
    int         n_exact = 0;
    std::string misses;
    for (const json & item : items) {
        const std::string image = k_items + "/" + item["image"][0].get<std::string>();
        const json j = run_json(dir, { "--image", image, "--question", item["question"], "-m", "snapkv", "-b", "100000",
                                       "-n", "12" });
        ASSERT_TRUE(j.contains("answers")) << item["id"];
        ASSERT_EQ(j["answers"].size(), 1u) << "one question, commas and all (\"row 3, column 1\")";
        EXPECT_EQ(j["answers"][0]["question"], item["question"]);
        const auto [width, height] = png_size(image);
        EXPECT_EQ(j["image_tokens"].get<int>(), (width / 8) * (height / 8)) << item["id"];
        EXPECT_EQ(j["prompt_tokens"].get<int>(), j["image_tokens"].get<int>() + k_text_tokens);
        const std::string answer = j["answers"][0]["text"].get<std::string>();
        if (answer == item["answers"][0].get<std::string>()) {
            ++n_exact;
        } else {
            misses += " " + item["id"].get<std::string>() + ": '" + answer + "'";
        }
    }
    EXPECT_EQ(n_exact, 8) << "misses:" << misses;
}

// The smaller-image baseline of the model card: --image-max-tokens B resizes the page to at most B tokens, and the
// cache holds exactly the smaller prompt.
TEST(tiny_qwen2vl, smaller_image_holds_at_most_b_tokens) {
    temp_dir          dir;
    const json        item  = held_out_items().at(7);
    const std::string image = k_items + "/" + item["image"][0].get<std::string>();
    for (const int b : { 50, 100, 200 }) {
        const json j = run_json(dir, { "--image", image, "--question", item["question"], "-m", "snapkv", "-b", "100000",
                                       "-n", "12", "--image-max-tokens", std::to_string(b) });
        ASSERT_TRUE(j.contains("image_tokens"));
        const int n_image = j["image_tokens"].get<int>();
        EXPECT_LE(n_image, b);
        EXPECT_GT(n_image, b / 2) << "resized to about B tokens, not far below";
        EXPECT_EQ(j["kv_bytes_prompt"].get<uint64_t>(), uint64_t(n_image + k_text_tokens) * k_cell_bytes);
    }
}

// Eviction keeps exactly the budget per KV head, before the question (question-agnostic, as `ecokv run --question`).
TEST(tiny_qwen2vl, compressed_cache_holds_the_budget) {
    temp_dir          dir;
    const json        item  = held_out_items().at(7);
    const std::string image = k_items + "/" + item["image"][0].get<std::string>();
    const json j = run_json(dir, { "--image", image, "--question", item["question"], "-m", "snapkv+ecokv", "-b", "100",
                                   "-n", "12", "--compare-full" });
    ASSERT_TRUE(j.contains("answers"));
    const auto [width, height] = png_size(image);
    EXPECT_EQ(j["kv_bytes_prompt"].get<uint64_t>(), uint64_t((width / 8) * (height / 8) + k_text_tokens) * k_cell_bytes);
    EXPECT_EQ(j["kv_bytes_kept"].get<uint64_t>(), 100u * k_cell_bytes);
    EXPECT_EQ(j["answers"][0]["full_text"], item["answers"][0]) << "the full cache's answer, from the generator";
}

json main_job(const temp_dir & dir, std::vector<std::string> args) {
    args.insert(args.begin(), { "run", "--json", "-t", "2", "-n", "8" });
    const run_result r = run_cli(dir.path().string(), args);
    EXPECT_EQ(r.code, 0) << describe(r);
    return r.code == 0 ? json::parse(r.out) : json::object();
}

// `ecokv run` with no options is the README's main job: tiny-qwen2vl asked the four questions of its sample receipt
// (held-out seed 240014; the fields as the generator drew them: BEEF 43.19, FIG 16.09, TAX 4.74, TOTAL 64.02) by the
// full cache, SnapKV and SnapKV + ECOKV at 100 entries per KV head, and the full cache of the page resized to the
// same entries. The page is 192x168 pixels: 24 x 21 cells of 8x8, 504 image tokens.
TEST(tiny_qwen2vl, run_without_options_is_the_main_job) {
    temp_dir   dir;
    const json j = main_job(dir, {});
    ASSERT_TRUE(j.contains("columns")) << j.dump();
    EXPECT_EQ(j["image_tokens"].get<int>(), 24 * 21);
    EXPECT_EQ(j["prompt_tokens"].get<int>(), 24 * 21 + k_text_tokens);
    const std::vector<std::pair<std::string, std::string>> page = {
        { "What is the BEEF?", "43.19" }, { "What is the FIG?", "16.09" }, { "What is the TAX?", "4.74" },
        { "What is the TOTAL?", "64.02" } };
    const json & cols = j["columns"];
    ASSERT_EQ(cols.size(), 4u);
    const std::vector<std::string> labels = { "full cache", "snapkv", "snapkv+ecokv", "smaller image" };
    for (size_t c = 0; c < cols.size(); ++c) {
        EXPECT_EQ(cols[c]["label"], labels[c]);
        ASSERT_EQ(cols[c]["answers"].size(), page.size());
        int n_correct = 0;
        for (size_t q = 0; q < page.size(); ++q) {
            const json & a = cols[c]["answers"][q];
            EXPECT_EQ(a["question"], page[q].first);
            EXPECT_EQ(a["truth"], page[q].second);
            EXPECT_EQ(a["correct"].get<bool>(), a["text"] == page[q].second) << "exact match, as the dataset scores";
            n_correct += a["text"] == page[q].second ? 1 : 0;
        }
        EXPECT_EQ(cols[c]["correct"].get<int>(), n_correct);
    }
    for (size_t q = 0; q < page.size(); ++q) {
        EXPECT_EQ(cols[0]["answers"][q]["text"], page[q].second) << "the full cache reads the page";
    }
    EXPECT_EQ(cols[0]["kv_bytes_kept"].get<uint64_t>(), uint64_t(24 * 21 + k_text_tokens) * k_cell_bytes);
    for (size_t c : { 1, 2 }) {
        EXPECT_EQ(cols[c]["budget"].get<int>(), 100);
        EXPECT_EQ(cols[c]["kv_bytes_kept"].get<uint64_t>(), 100u * k_cell_bytes) << "uniform: 100 entries per head";
    }
    // The smaller image: the page's 5 text cells stay, the image gets at most the other 95 entries.
    EXPECT_EQ(cols[3]["image_max_tokens"].get<int>(), 100 - k_text_tokens);
    const int n_small = cols[3]["image_tokens"].get<int>();
    EXPECT_LE(n_small, 100 - k_text_tokens);
    EXPECT_EQ(cols[3]["kv_bytes_kept"].get<uint64_t>(), uint64_t(n_small + k_text_tokens) * k_cell_bytes);

    // A method and budget given: that method alone beside the full cache and the smaller image at its budget.
    const json m = main_job(dir, { "-m", "snapkv", "-b", "60" });
    ASSERT_EQ(m["columns"].size(), 3u);
    EXPECT_EQ(m["columns"][1]["budget"].get<int>(), 60);
    EXPECT_EQ(m["columns"][1]["kv_bytes_kept"].get<uint64_t>(), 60u * k_cell_bytes);
    EXPECT_EQ(m["columns"][2]["image_max_tokens"].get<int>(), 60 - k_text_tokens);

    // --method full: the full cache beside the smaller image at the budget, nothing compressed.
    const json f = main_job(dir, { "-m", "full", "-b", "80" });
    ASSERT_EQ(f["columns"].size(), 2u) << f.dump();
    EXPECT_EQ(f["columns"][0]["label"], "full cache");
    EXPECT_EQ(f["columns"][1]["image_max_tokens"].get<int>(), 80 - k_text_tokens);
}

// --method full answers from the prefill's own cache: the smaller-image baseline of the model card, run on its own.
TEST(tiny_qwen2vl, method_full_keeps_the_whole_cache) {
    temp_dir          dir;
    const json        item  = held_out_items().at(3);
    const std::string image = k_items + "/" + item["image"][0].get<std::string>();
    const json        j     = run_json(dir, { "--image", image, "--question", item["question"], "-m", "full", "-n", "12" });
    ASSERT_TRUE(j.contains("answers")) << j.dump();
    EXPECT_EQ(j["method"], "full");
    EXPECT_TRUE(j["budget"].is_null());
    const auto [width, height] = png_size(image);
    const uint64_t prompt_bytes = uint64_t((width / 8) * (height / 8) + k_text_tokens) * k_cell_bytes;
    EXPECT_EQ(j["kv_bytes_prompt"].get<uint64_t>(), prompt_bytes);
    EXPECT_EQ(j["kv_bytes_kept"].get<uint64_t>(), prompt_bytes);
    EXPECT_EQ(j["answers"][0]["text"], item["answers"][0]) << "the full cache's answer, from the generator";

    for (const char * flag : { "--compare-full", "--dump-capture" }) {
        std::vector<std::string> args = { "run", "--model", k_model, "--mmproj", k_mmproj, "--image", image,
                                          "--question", "Q", "-m", "full", flag };
        if (std::string(flag) == "--dump-capture") {
            args.push_back(dir / "c.bin");
        }
        const run_result r = run_cli(dir.path().string(), args);
        EXPECT_EQ(r.code, 1) << describe(r);
        EXPECT_TRUE(contains(r.err, std::string("ecokv run: error: ") + flag +
                                        " needs a compression; --method full keeps the whole cache"))
            << describe(r);
    }
}

}  // namespace

// eval --turns on the sample page's 4 questions, one conversation (docs/conversations.md): a budget covering every
// cell of it (1000 > 509 + 4 turns) answers every turn as the full cache does and holds as many entries; at budget 100
// compressed again after each answer (slack 0), the longest head never holds more than 100 + the turn's cells (its
// message, at most the prompt's growth since the turn before, and at most 16 answer tokens).
TEST(tiny_qwen2vl, eval_turns_asks_the_page_in_one_conversation) {
    temp_dir                       dir;
    const std::string              data = k_models + "/tiny-qwen2vl-sample";
    const auto                     eval = [&](const std::string & out, std::vector<std::string> extra) {
        std::vector<std::string> args = { "eval", "-t", "2", "--model", k_model, "--mmproj", k_mmproj, "--dataset",
                                          "generated", "--data", data, "--turns", "--out", dir / out };
        args.insert(args.end(), extra.begin(), extra.end());
        const run_result r = run_cli(dir.path().string(), args);
        EXPECT_EQ(r.code, 0) << describe(r);
        std::vector<json> recs;
        std::istringstream lines(read_file(dir / (out + "/results.jsonl")));
        for (std::string line; std::getline(lines, line);) {
            recs.push_back(json::parse(line));
        }
        return recs;
    };
    const auto covering = eval("cover", { "--methods", "full,snapkv+ecokv", "--budgets", "1000" });
    ASSERT_EQ(covering.size(), 8u);
    for (size_t i = 0; i < 4; ++i) {
        const json &full = covering[i], &comp = covering[4 + i];
        ASSERT_EQ(full["method"], "full");
        EXPECT_EQ(full["turn"], i + 1);
        EXPECT_EQ(comp["prediction"], full["prediction"]) << "turn " << i + 1;
        EXPECT_EQ(comp["entries_held"], full["entries_held"]) << "turn " << i + 1;
        EXPECT_EQ(comp["same_as_full"], true);
    }
    EXPECT_EQ(covering[0]["score"], 1.0) << "the first question, answered exactly (models/tiny-qwen2vl.md)";
    const auto bounded = eval("bounded", { "--methods", "snapkv+ecokv", "--budgets", "100", "--recompress-slack", "0" });
    ASSERT_EQ(bounded.size(), 4u);
    for (size_t i = 1; i < 4; ++i) {
        const int grown = bounded[i]["prompt_tokens"].get<int>() - bounded[i - 1]["prompt_tokens"].get<int>();
        EXPECT_LE(bounded[i]["entries_held"].get<int>(), 100 + grown + 16) << "turn " << i + 1;
    }
    const run_result no_turns = run_cli(dir.path().string(), { "eval", "--model", k_model, "--dataset", "generated",
                                                               "--data", data, "--methods", "snapkv", "--out",
                                                               dir / "x", "--recompress-slack", "4" });
    EXPECT_EQ(no_turns.code, 1);
    EXPECT_TRUE(contains(no_turns.err, "--recompress-slack compresses a conversation again between its turns: it "
                                       "needs --turns")) << describe(no_turns);
}
