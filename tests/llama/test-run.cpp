// `ecokv run` end to end on the real trained stories260K (models/, bundled): a budget covering the prompt
// reproduces the full cache token for token, a small budget reports agreement and KL, question-agnostic mode
// answers several questions from one compressed cache, and bad input gives a clear error and exit 1.
#include "test-util.h"

#include "ecokv/llama-options.h"
#include "ecokv/llama-session.h"
#include "ecokv/options.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <sstream>

namespace {

using namespace ecokv::test;
using json = nlohmann::json;

const std::string k_model  = std::string(ECOKV_ROOT) + "/models/stories260K.gguf";
const std::string k_prompt = std::string(ECOKV_ROOT) + "/data/prompts/story.txt";

json run_json(const temp_dir & dir, std::vector<std::string> args) {
    args.insert(args.begin(), { "run", "--model", k_model, "--json", "-t", "2" });
    const run_result r = run_cli(dir.path().string(), args);
    EXPECT_EQ(r.code, 0) << describe(r);
    return r.code == 0 ? json::parse(r.out) : json::object();
}

TEST(run, budget_covering_the_prompt_matches_the_full_cache_token_for_token) {
    temp_dir   dir;
    const json j = run_json(dir, { "-f", k_prompt, "-m", "snapkv+ecokv", "-b", "1024", "-n", "24", "--compare-full" });
    ASSERT_TRUE(j.contains("text"));
    EXPECT_GE(j["prompt_tokens"].get<int>(), 300);
    EXPECT_EQ(j["answers"][0]["text"], j["answers"][0]["full_text"]);
    EXPECT_EQ(j["agreement"].get<double>(), 1.0);
    EXPECT_LT(j["mean_kl"].get<double>(), 1e-6);
    EXPECT_EQ(j["cells_per_head"].get<int>(), j["prompt_tokens"].get<int>());
}

TEST(run, budget_64_on_a_400_token_story_reports_agreement_and_kl) {
    temp_dir dir;
    for (const char * method : { "snapkv", "snapkv+ecokv", "pyramidkv+ecokv", "adakv+mixkv", "streamingllm" }) {
        const json j = run_json(dir, { "-f", k_prompt, "-m", method, "-b", "64", "-n", "32", "--compare-full" });
        ASSERT_TRUE(j.contains("agreement")) << method;
        std::printf("[stories260K] %-16s prompt %d tokens, budget 64: agreement %.3f, mean KL %.4f, KV %llu -> %llu bytes\n",
                    method, j["prompt_tokens"].get<int>(), j["agreement"].get<double>(), j["mean_kl"].get<double>(),
                    j["kv_bytes_full"].get<unsigned long long>(), j["kv_bytes_compressed"].get<unsigned long long>());
        EXPECT_GE(j["agreement"].get<double>(), 0.0);
        EXPECT_LE(j["agreement"].get<double>(), 1.0);
        EXPECT_GE(j["mean_kl"].get<double>(), 0.0);
        EXPECT_LT(j["kv_bytes_compressed"].get<uint64_t>(), j["kv_bytes_full"].get<uint64_t>()) << method;
        EXPECT_LT(j["kv_bytes_kept"].get<uint64_t>(), j["kv_bytes_compressed"].get<uint64_t>()) << method;
    }
}

// --chunk: a budget covering the prompt still reproduces the full cache; a small one holds at most llama.cpp's smallest
// cache (256 cells) where one shot allocates the story's (its tokens and the 32 new ones, padded to 256 cells), and
// the kept entries are the same count.
TEST(run, a_chunked_prefill_bounds_the_peak) {
    temp_dir   dir;
    const json cover = run_json(dir, { "-f", k_prompt, "-m", "snapkv+ecokv", "-b", "1024", "-n", "16", "--chunk", "64",
                                       "--compare-full" });
    EXPECT_EQ(cover["answers"][0]["text"], cover["answers"][0]["full_text"]);
    EXPECT_LT(cover["mean_kl"].get<double>(), 1e-6);
    const json one     = run_json(dir, { "-f", k_prompt, "-m", "snapkv", "-b", "64", "-n", "32" });
    const json chunked = run_json(dir, { "-f", k_prompt, "-m", "snapkv", "-b", "64", "-n", "32", "--chunk", "96" });
    const int  n       = one["prompt_tokens"].get<int>();
    EXPECT_EQ(chunked["prompt_tokens"].get<int>(), n);
    EXPECT_EQ(one["peak_kv_cells"].get<int>(), (n + 32 + 255) / 256 * 256);
    EXPECT_EQ(chunked["peak_kv_cells"].get<int>(), 256);
    EXPECT_LT(chunked["peak_kv_bytes"].get<uint64_t>(), one["peak_kv_bytes"].get<uint64_t>());
    EXPECT_EQ(chunked["kv_bytes_kept"], one["kv_bytes_kept"]);
    EXPECT_EQ(chunked["chunk"].get<int>(), 96);
}

// --decode-compress N: a 200-token story continuation re-compressed every 32 decoded cells ends holding the budget and
// at most 32 more entries in its longest head (199 decoded: 6 re-compressions, 7 cells since the last), where the
// answer without it ends holding the budget and all 199; a covering budget re-compresses nothing away and answers as
// the full cache; chunked prefill and decode compression compose.
TEST(run, a_re_compressing_answer_stays_bounded) {
    temp_dir   dir;
    const json plain = run_json(dir, { "-f", k_prompt, "-m", "snapkv+ecokv", "-b", "64", "-n", "200" });
    const json every = run_json(dir, { "-f", k_prompt, "-m", "snapkv+ecokv", "-b", "64", "-n", "200",
                                       "--decode-compress", "32", "--compare-full" });
    ASSERT_TRUE(every.contains("cells_held_end")) << every.dump();
    EXPECT_EQ(plain["cells_held_end"].get<int>(), 64 + 199);
    EXPECT_EQ(every["cells_held_end"].get<int>(), 64 + 7);
    EXPECT_EQ(every["decode_compress"].get<int>(), 32);
    EXPECT_GT(every["compress_s_end"].get<double>(), every["compress_s"].get<double>()) << "six more compressions";
    EXPECT_TRUE(every["answers"][0]["agreement"].is_null()) << "no teacher-forced fidelity for a re-compressing answer";
    EXPECT_FALSE(every["answers"][0]["full_text"].get<std::string>().empty());
    const json cover = run_json(dir, { "-f", k_prompt, "-m", "snapkv+ecokv", "-b", "1024", "-n", "64",
                                       "--decode-compress", "16", "--compare-full" });
    EXPECT_EQ(cover["answers"][0]["text"], cover["answers"][0]["full_text"]);
    const json chunked = run_json(dir, { "-f", k_prompt, "-m", "snapkv", "-b", "64", "-n", "100", "--chunk", "96",
                                         "--decode-compress", "40" });
    EXPECT_EQ(chunked["cells_held_end"].get<int>(), 64 + 99 % 40);
    EXPECT_EQ(chunked["peak_kv_cells"].get<int>(), 256);
    for (const auto & [args, message] :
         std::vector<std::pair<std::vector<std::string>, std::string>>{
             { { "-m", "full", "--decode-compress", "16" }, "--decode-compress re-compresses one answer of a compressed" },
             { { "-m", "snapkv", "--decode-compress", "40", "--question", "a", "--question", "b" }, "at most one --question" },
             { { "-m", "snapkv", "--decode-compress", "-1" }, "--decode-compress -1 must lie in [0, 16777216]" },
             { { "-m", "snapkv", "--decode-compress", "16" }, "--decode-compress 16 must be larger than the window of 32" } }) {
        std::vector<std::string> a = { "run", "--model", k_model, "-f", k_prompt, "-n", "64" };
        a.insert(a.end(), args.begin(), args.end());
        const run_result r = run_cli(dir.path().string(), a);
        EXPECT_EQ(r.code, 1) << describe(r);
        EXPECT_TRUE(contains(r.err, message)) << "expected '" << message << "'\n" << describe(r);
    }
}

TEST(run, questions_are_answered_from_one_compressed_cache) {
    temp_dir    dir;
    const std::string story = read_file(k_prompt);
    // A budget covering the context: each answer must equal the full cache's answer to the same question.
    const json j = run_json(dir, { "-p", story, "--question", "Lily said", "--question", "The dog", "-m", "snapkv+ecokv",
                                   "-b", "1024", "-n", "12", "--compare-full" });
    ASSERT_EQ(j["answers"].size(), 2u);
    for (const auto & a : j["answers"]) {
        EXPECT_EQ(a["text"], a["full_text"]) << a["question"];
        EXPECT_EQ(a["agreement"].get<double>(), 1.0);
    }
    // A small budget answers too, from the compressed context only.
    const json small = run_json(dir, { "-p", story, "--question", "Lily said", "--question", "The dog", "-m", "snapkv+ecokv",
                                       "-b", "48", "-n", "12" });
    ASSERT_EQ(small["answers"].size(), 2u);
    EXPECT_EQ(small["cells_per_head"].get<int>(), 48);
}

// eval checks the context length as run does: an item longer than the model's context is recorded as failed with
// the reason, the others are answered.
TEST(eval, an_item_beyond_the_context_is_recorded_as_failed) {
    temp_dir dir;
    write_file(dir / "niah.json", R"({"count": 2, "context_words": 1200, "n_lengths": 2, "n_depths": 1})");
    const run_result r = run_cli(dir.path().string(),
                                 { "eval", "--model", k_model, "--dataset", "niah", "--data", dir.path().string(),
                                   "--methods", "full,snapkv", "--budgets", "64", "-n", "4", "-t", "2", "--out",
                                   dir / "out" });
    ASSERT_EQ(r.code, 0) << describe(r);
    std::istringstream lines(read_file(dir / "out/results.jsonl"));
    std::map<std::string, int> failed, answered;
    for (std::string line; std::getline(lines, line);) {
        const json rec = json::parse(line);
        if (rec.contains("error")) {
            EXPECT_TRUE(contains(rec["error"].get<std::string>(), "exceeds the model's context of 2048")) << line;
            ++failed[rec["id"]];
        } else {
            ++answered[rec["id"]];
        }
    }
    // Item 0 has 600 words (length level 1 of 2), about 1450 tokens; item 1 1200 words, about 2900.
    EXPECT_EQ(answered["niah-0"], 2);
    EXPECT_EQ(failed["niah-1"], 2);
}

TEST(run, bad_input_gives_a_clear_error) {
    temp_dir dir;
    write_file(dir / "corrupt.gguf", "GGUF this is not a model");
    std::string long_prompt;
    for (int i = 0; i < 4000; ++i) {
        long_prompt += "Once upon a time there was a dog. ";
    }
    write_file(dir / "long.txt", long_prompt);
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        { { "run", "--model", dir / "missing.gguf", "-p", "hi", "-m", "ecokv" }, "no such model file" },
        { { "run", "--model", dir / "corrupt.gguf", "-p", "hi", "-m", "ecokv" }, "not a readable GGUF file" },
        { { "run", "--model", k_model, "-f", dir / "long.txt", "-m", "ecokv" }, "exceeds the model's context" },
        { { "run", "--model", k_model, "-p", "hi", "-m", "ecokv", "-b", "4" }, "--budget 4 must be larger than --window 4" },
        { { "run", "--model", k_model, "-p", "hi", "-m", "snapk" }, "unknown method 'snapk'" },
        { { "run", "--model", k_model, "-m", "ecokv" }, "exactly one of -p/--prompt and -f/--file" },
        { { "run", "--model", k_model, "-f", dir / "nope.txt", "-m", "ecokv" }, "cannot open prompt file" },
        { { "run", "--model", k_model, "-f", dir.path().string(), "-m", "ecokv" }, "cannot open prompt file" },
        { { "run", "--model", k_model, "-p", "hi", "-t", "100000" }, "--threads 100000 must lie in [0, 512]" },
        { { "run", "--model", k_model, "-p", "", "-m", "ecokv" },
          "the prompt has 1 token; uniform+ecokv needs more than its observation window of 4" },
        { { "run", "--model", k_model, "-p", "hi", "-n", "0" }, "-n 0 must lie in [1, 1000000]" },
        { { "run", "--model", k_model, "-f", k_prompt, "--chunk", "-1" }, "--chunk -1 must lie in [0, 16777216]" },
        { { "run", "--model", k_model, "-f", k_prompt, "--chunk", "16", "-m", "snapkv" },
          "--chunk 16 must be larger than the window of 32" },
        { { "run", "--model", k_model, "-f", k_prompt, "--chunk", "64", "--dump-capture", dir / "c.st" },
          "--dump-capture writes the capture of a one-shot prefill" },
    };
    for (const auto & [args, message] : cases) {
        const run_result r = run_cli(dir.path().string(), args);
        EXPECT_EQ(r.code, 1) << describe(r);
        EXPECT_TRUE(contains(r.err, message)) << "expected '" << message << "'\n" << describe(r);
    }
}

}  // namespace

// Every row of the option tables is a flag of every command it applies to (eval takes method and budget as the
// lists --methods and --budgets), and the help shows it.
TEST(run, every_option_row_is_a_flag) {
    temp_dir dir;
    const std::map<std::string, unsigned> commands = {
        { "run", ecokv::scope_method | ecokv::scope_prefill | ecokv::scope_decode },
        { "serve", ecokv::scope_method | ecokv::scope_prefill | ecokv::scope_decode | ecokv::scope_turns },
        { "eval", ecokv::scope_method | ecokv::scope_prefill | ecokv::scope_decode | ecokv::scope_turns },
        { "analyze", ecokv::scope_method },
        { "compress", ecokv::scope_method } };
    for (const auto & [command, scopes] : commands) {
        const run_result r = run_cli(dir.path().string(), { command, "--help" });
        ASSERT_EQ(r.code, 0) << describe(r);
        for (const ecokv::option_info & o : ecokv::compression_options()) {
            const bool        listed = command == "eval" && (o.key == "method" || o.key == "budget");
            const std::string flag   = "--" + o.flag() + (listed ? "s" : "");
            EXPECT_EQ(contains(r.out, flag + " "), (o.scope & scopes) != 0) << command << " " << flag;
        }
        for (const ecokv::llama::engine_option & o : ecokv::llama::engine_options()) {
            if (command == "compress" && o.key == "threads") {
                continue;  // compress has threads of its own: the core's, no engine
            }
            EXPECT_EQ(contains(r.out, "--" + o.flag() + " "), command != "compress") << command << " " << o.flag();
        }
    }
}

// llama.cpp's offload options, with its spellings: -ngl takes a count, auto or all; --device names a device of this
// build (an unknown one is an error listing them); --list-devices prints them and exits; -ngl on a build without a
// usable GPU warns as llama.cpp does and runs on the CPU, where a compression copies nothing to the host.
TEST(run, offload_options_are_llamas) {
    temp_dir         dir;
    const run_result bad = run_cli(dir.path().string(), { "run", "--model", k_model, "-f", k_prompt, "-ngl", "many" });
    EXPECT_EQ(bad.code, 1) << describe(bad);
    EXPECT_TRUE(contains(bad.err, "--n-gpu-layers 'many' is not a number (nor auto or all)")) << describe(bad);
    const run_result dev = run_cli(dir.path().string(), { "run", "--model", k_model, "-f", k_prompt, "-dev", "Nope0" });
    EXPECT_EQ(dev.code, 1) << describe(dev);
    EXPECT_TRUE(contains(dev.err, "--device Nope0: no device 'Nope0'; ")) << describe(dev);
    const run_result flag = run_cli(dir.path().string(), { "run", "--model", k_model, "-f", k_prompt,
                                                           "--no-mmproj-offload=maybe" });
    EXPECT_TRUE(contains(flag.err, "--no-mmproj-offload takes no value (or true/false), not 'maybe'")) << describe(flag);
    for (const char * command : { "run", "eval", "serve", "analyze" }) {
        const run_result list = run_cli(dir.path().string(), { command, "--list-devices" });
        EXPECT_EQ(list.code, 0) << describe(list);
        EXPECT_TRUE(contains(list.out, "Available devices:\n")) << describe(list);
    }
    if (ecokv::llama::gpu_offload_supported()) {
        return;  // scripts/test-gpu.sh runs the rest on the device
    }
    EXPECT_TRUE(contains(run_cli(dir.path().string(), { "run", "--list-devices" }).out, "  (none)\n"));
    const run_result cpu = run_cli(dir.path().string(), { "run", "--model", k_model, "-f", k_prompt, "--json", "-n",
                                                          "4", "-b", "64", "-ngl", "all", "--no-mmproj-offload" });
    ASSERT_EQ(cpu.code, 0) << describe(cpu);
    EXPECT_TRUE(contains(cpu.err, "warning: no usable GPU found, --n-gpu-layers is ignored")) << describe(cpu);
    EXPECT_EQ(json::parse(cpu.out)["bytes_to_host"].get<uint64_t>(), 0u);
}

// Engine options reach llama.cpp: an F32 cache takes twice the F16 bytes (K and V), -c bounds the context, and
// llama.cpp's multi-letter spellings are taken.
TEST(run, engine_options_reach_the_context) {
    temp_dir   dir;
    const json f16 = run_json(dir, { "-f", k_prompt, "-m", "snapkv", "-b", "64", "-n", "4" });
    const json f32 = run_json(dir, { "-f", k_prompt, "-m", "snapkv", "-b", "64", "-n", "4", "-ctk", "f32", "-ctv", "f32",
                                     "-ub", "64", "-fa", "off" });
    ASSERT_TRUE(f16.contains("kv_bytes_kept") && f32.contains("kv_bytes_kept"));
    EXPECT_EQ(f32["kv_bytes_kept"].get<uint64_t>(), 2 * f16["kv_bytes_kept"].get<uint64_t>());
    EXPECT_EQ(f32["kv_bytes_compressed"].get<uint64_t>(), 2 * f16["kv_bytes_compressed"].get<uint64_t>());
    const run_result small = run_cli(dir.path().string(), { "run", "--model", k_model, "-f", k_prompt, "-c", "100" });
    EXPECT_EQ(small.code, 1) << describe(small);
    EXPECT_TRUE(contains(small.err, "new ones exceeds --ctx-size 100")) << describe(small);
    const run_result bad = run_cli(dir.path().string(), { "run", "--model", k_model, "-f", k_prompt, "-ctk", "q9" });
    EXPECT_TRUE(contains(bad.err, "--cache-type-k must be f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0 or q5_1, not 'q9'")) << describe(bad);
}
