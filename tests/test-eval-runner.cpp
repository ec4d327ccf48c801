// The evaluation runner (ecokv/eval-runner.h) with a scripted engine, no model: what it records for answers, for an
// item the engine cannot process and for output that is not valid UTF-8, and what it checks before any work.
#include "ecokv/error.h"
#include "ecokv/eval-runner.h"
#include "test-util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>

namespace {

using namespace ecokv::test;
using json = nlohmann::json;

// Answers every item with its own gold answer (full cache) or `compressed_output`; fails the items listed in `fail`.
class scripted_engine : public ecokv::eval_engine {
  public:
    std::string              compressed_output = "wrong";
    std::set<std::string>    fail;
    std::vector<std::string> prefilled;

    ecokv::eval_prefill prefill(const ecokv::eval_item & item, ecokv::eval_mode, int32_t,
                                const ecokv::method_requirements & needs) override {
        prefilled.push_back(item.id);
        needs_ = needs;
        if (fail.count(item.id)) {
            throw ecokv::error("this item cannot be processed");
        }
        answer_ = item.answers.at(0);
        return { 10, 0, 1000, 0.5 };
    }
    ecokv::eval_answer answer_full() override { return { answer_, 0.1, 0, 1000, {}, {}, {} }; }
    ecokv::eval_answer answer_compressed(const ecokv::compression & c) override {
        return { compressed_output + "\nsecond line", 0.1, 0.01, uint64_t(c.params.budget), 0.5, 0.25, { 0.1, 0.2 } };
    }
    ecokv::method_requirements needs_;

  private:
    std::string answer_;
};

struct runner_fixture {
    temp_dir            dir;
    ecokv::eval_options o;

    runner_fixture() {
        write_file(dir / "model.gguf", "not really a model");
        o.dataset = "niah";  // generated: no data directory
        o.limit   = 3;
        o.methods = { "full", "mixkv" };
        o.budgets = { 64, 40 };
        o.settings.params.window = 36;
        o.out_dir = dir / "out";
        o.model   = dir / "model.gguf";
    }
    std::vector<json> records() const {
        std::vector<json>  out;
        std::istringstream lines(read_file(o.out_dir + "/results.jsonl"));
        for (std::string line; std::getline(lines, line);) {
            out.push_back(json::parse(line));
        }
        return out;
    }
};

TEST(eval_runner, records_every_item_method_and_budget) {
    runner_fixture   f;
    scripted_engine  engine;
    ecokv::run_eval(ecokv::plan_eval(f.o), engine);
    const auto recs = f.records();
    ASSERT_EQ(recs.size(), 9u);  // 3 items x (full + mixkv at 2 budgets)
    EXPECT_EQ(engine.prefilled.size(), 3u);
    EXPECT_EQ(engine.needs_.n_window_queries, 36);  // the window asked for, not a fixed 32
    for (const json & r : recs) {
        if (r["method"] == "full") {
            EXPECT_EQ(r["score"], 1.0) << r.dump();  // the gold answer, exact match
            EXPECT_FALSE(r.contains("agreement"));
        } else {
            EXPECT_EQ(r["method"], "uniform+mixkv");
            EXPECT_EQ(r["prediction"], "wrong");  // the first line only, for exact match
            EXPECT_EQ(r["score"], 0.0);
            EXPECT_EQ(r["kv_bytes_compressed"], r["budget"]);
            EXPECT_EQ(r["attn_rel_error"], json({ 0.1, 0.2 }));
        }
        EXPECT_EQ(r["config"], recs[0]["config"]);
    }
    // A resume has nothing left to do: no prefill.
    scripted_engine again;
    ecokv::run_eval(ecokv::plan_eval(f.o), again);
    EXPECT_TRUE(again.prefilled.empty());
}

// A failed answer fails only its (method, budget); the item's other answers are recorded.
// Two names of one method and a repeated budget run once each.
TEST(eval_runner, a_method_or_budget_named_twice_runs_once) {
    runner_fixture f;
    f.o.methods = { "mixkv", "snapkv+mixkv", "uniform+mixkv" };
    f.o.budgets = { 64, 64 };
    scripted_engine engine;
    ecokv::run_eval(ecokv::plan_eval(f.o), engine);
    EXPECT_EQ(f.records().size(), 3u);  // 3 items x 1 method x 1 budget
}

TEST(eval_runner, a_failed_answer_fails_only_itself) {
    struct picky_engine : scripted_engine {
        ecokv::eval_answer answer_compressed(const ecokv::compression & c) override {
            if (c.params.budget == 40) {
                throw ecokv::error("budget 40 is not supported here");
            }
            return scripted_engine::answer_compressed(c);
        }
    };
    runner_fixture f;
    picky_engine   engine;
    ecokv::run_eval(ecokv::plan_eval(f.o), engine);
    int failed = 0, answered = 0;
    for (const json & r : f.records()) {
        if (r.contains("error")) {
            EXPECT_EQ(r["budget"], 40) << r.dump();
            EXPECT_EQ(r["error"], "budget 40 is not supported here");
            ++failed;
        } else {
            ++answered;
        }
    }
    EXPECT_EQ(failed, 3);
    EXPECT_EQ(answered, 6);
}

TEST(eval_runner, a_failed_item_is_recorded_unless_strict) {
    runner_fixture  f;
    scripted_engine engine;
    engine.fail = { "niah-1" };
    f.o.strict  = true;
    EXPECT_EQ(error_of([&] { ecokv::run_eval(ecokv::plan_eval(f.o), engine); }),
              "item 'niah-1': this item cannot be processed");
    f.o.strict = false;
    fs::remove_all(f.o.out_dir);
    ecokv::run_eval(ecokv::plan_eval(f.o), engine);
    int failed = 0;
    for (const json & r : f.records()) {
        if (r["id"] == "niah-1") {
            EXPECT_EQ(r["error"], "this item cannot be processed");
            EXPECT_TRUE(r["score"].is_null());
            ++failed;
        }
    }
    EXPECT_EQ(failed, 3);
}

// An output cut inside a UTF-8 character is written with U+FFFD instead of stopping the run at every resume.
TEST(eval_runner, invalid_utf8_output_is_replaced) {
    runner_fixture  f;
    scripted_engine engine;
    engine.compressed_output = "ab\xe2\x82";  // the first two bytes of the euro sign
    f.o.limit                = 1;
    ecokv::run_eval(ecokv::plan_eval(f.o), engine);
    for (const json & r : f.records()) {
        if (r["method"] != "full") {
            EXPECT_EQ(r["prediction"], "ab\xef\xbf\xbd");
        }
    }
}

TEST(eval_runner, options_are_checked_before_any_work) {
    runner_fixture f;
    auto           plan_error = [&](auto && change) {
        ecokv::eval_options o = f.o;
        change(o);
        return error_of([&] { ecokv::plan_eval(o); });
    };
    EXPECT_EQ(plan_error([](auto & o) { o.n_predict = 0; }), "-n 0 must lie in [1, 1000000]");
    EXPECT_EQ(plan_error([](auto & o) { o.budgets = { 30 }; }),
              "--budget 30 must be larger than --window 36 (the budget includes the window)");
    EXPECT_EQ(plan_error([](auto & o) { o.methods = { "snapk" }; }).substr(0, 24), "unknown method 'snapk'; ");
    EXPECT_EQ(plan_error([](auto & o) { o.dataset = "nope"; }).substr(0, 24), "unknown dataset 'nope'; ");
    EXPECT_EQ(plan_error([](auto & o) { o.model = "/no/such/model.gguf"; }), "/no/such/model.gguf: cannot read");
    EXPECT_FALSE(fs::exists(f.o.out_dir + "/results.jsonl"));
}

}  // namespace

// config.json records every option of the table but method and budget (each record names those), options recorded
// unless_default only when changed, and the engine's recorded options by their keys.
TEST(eval_runner, config_records_every_option_row) {
    runner_fixture f;
    f.o.settings.params.mixkv_scale   = ecokv::mixkv_scale_kind::importance;  // every unless_default row changed
    f.o.settings.params.ecokv_weights = ecokv::ecokv_weights_kind::figure3;
    f.o.settings.chunk                = 64;
    f.o.settings.decode_compress      = 40;
    f.o.engine                      = { { "flash_attn", std::string("off") }, { "image_max_tokens", int64_t(50) } };
    ecokv::plan_eval(f.o);
    const json config = json::parse(read_file(f.o.out_dir + "/config.json"));
    for (const ecokv::option_info & o : ecokv::compression_options()) {
        if (o.key != "recompress_slack") {  // --turns only: below
            EXPECT_EQ(config.contains(o.key), o.record != ecokv::option_record::never) << o.key;
        }
    }
    EXPECT_EQ(config["window"], 36);
    EXPECT_EQ(config["floor_ratio"], nullptr);  // the method's default
    EXPECT_EQ(config["mixkv_scale"], "importance");
    EXPECT_EQ(config["chunk"], 64);
    EXPECT_EQ(config["flash_attn"], "off");
    EXPECT_EQ(config["image_max_tokens"], 50);
    runner_fixture d;  // defaults: the options added later are absent, as in directories written before them
    ecokv::plan_eval(d.o);
    const json plain = json::parse(read_file(d.o.out_dir + "/config.json"));
    for (const char * later : { "mixkv_scale", "ecokv_weights", "chunk", "decode_compress", "recompress_slack", "turns",
                                "flash_attn", "image_max_tokens" }) {
        EXPECT_FALSE(plain.contains(later)) << later;
    }
    runner_fixture t;
    t.o.turns                     = true;
    t.o.mode                      = ecokv::eval_mode::agnostic;
    t.o.settings.recompress_slack = 8;
    ecokv::plan_eval(t.o);
    const json turns = json::parse(read_file(t.o.out_dir + "/config.json"));
    EXPECT_EQ(turns["recompress_slack"], 8);
    EXPECT_EQ(turns["turns"], true);
    EXPECT_EQ(turns["mode"], "agnostic");
}

// --turns: consecutive items about one context are one conversation (here 3 turns about "page A", 2 about "page B",
// 1 about "page A" again, which is a new conversation); the engine is asked each conversation once with the full
// cache and once per (method, budget); each turn's record carries its number, the entries held and whether its
// answer is the full conversation's; shards take whole conversations.
namespace {

class conversing_engine : public scripted_engine {
  public:
    std::vector<std::pair<std::vector<std::string>, std::string>> asked;  // (item ids, "full" or the method)

    std::vector<ecokv::eval_turn> converse(const std::vector<ecokv::eval_item> & turns, const ecokv::compression * c,
                                           int32_t) override {
        std::vector<std::string> ids;
        std::vector<ecokv::eval_turn> out;
        for (size_t i = 0; i < turns.size(); ++i) {
            ids.push_back(turns[i].id);
            ecokv::eval_turn t;
            // The full cache answers right; compressed, the second turn goes wrong.
            t.answer.output       = c && i == 1 ? "wrong" : turns[i].answers.at(0);
            t.answer.entries_held = c ? c->params.budget + int32_t(i) : 100 + 10 * int32_t(i);
            out.push_back(t);
        }
        asked.emplace_back(ids, c ? c->name() : "full");
        return out;
    }
};

struct turns_fixture : runner_fixture {
    turns_fixture() {
        fs::create_directories(dir / "data");
        write_file(dir / "data/items.jsonl",
                   R"({"id": "a1", "image": [], "context": "page A", "question": "q1", "answers": ["1"], "type": "t"}
{"id": "a2", "image": [], "context": "page A", "question": "q2", "answers": ["2"], "type": "t"}
{"id": "a3", "image": [], "context": "page A", "question": "q3", "answers": ["3"], "type": "t"}
{"id": "b1", "image": [], "context": "page B", "question": "q1", "answers": ["4"], "type": "t"}
{"id": "b2", "image": [], "context": "page B", "question": "q2", "answers": ["5"], "type": "t"}
{"id": "c1", "image": [], "context": "page A", "question": "q1", "answers": ["6"], "type": "t"}
)");
        o.dataset  = "generated";
        o.data_dir = dir / "data";
        o.limit    = 0;
        o.methods  = { "full", "mixkv" };
        o.budgets  = { 64 };
        o.turns    = true;
        o.mode     = ecokv::eval_mode::agnostic;
    }
};

}  // namespace

TEST(eval_runner, turns_ask_each_conversation_once_per_cache) {
    turns_fixture     f;
    conversing_engine engine;
    ecokv::run_eval(ecokv::plan_eval(f.o), engine);
    using ids = std::vector<std::string>;
    ASSERT_EQ(engine.asked.size(), 6u);  // 3 conversations x (the full cache, mixkv at 64)
    EXPECT_EQ(engine.asked[0], std::make_pair(ids{ "a1", "a2", "a3" }, std::string("full")));
    EXPECT_EQ(engine.asked[1], std::make_pair(ids{ "a1", "a2", "a3" }, std::string("uniform+mixkv")));
    EXPECT_EQ(engine.asked[2].first, (ids{ "b1", "b2" }));
    EXPECT_EQ(engine.asked[4].first, (ids{ "c1" }));
    EXPECT_TRUE(engine.prefilled.empty()) << "no single-question prefill";
    const auto recs = f.records();
    ASSERT_EQ(recs.size(), 12u);  // 6 items x 2 caches
    for (const json & r : recs) {
        const bool    full = r["method"] == "full";
        const int32_t turn = r["turn"].get<int32_t>();
        EXPECT_EQ(r["turn"], r["id"].get<std::string>()[1] - '0') << r.dump();
        EXPECT_EQ(r["entries_held"], full ? 100 + 10 * (turn - 1) : 64 + turn - 1);
        EXPECT_EQ(r["score"], full || turn != 2 ? 1.0 : 0.0) << r.dump();
        EXPECT_EQ(r["same_as_full"], full || turn != 2) << r.dump();
    }
    // Resumed: nothing left; shards take whole conversations (conversations 0 and 2 in shard 0 of 2).
    conversing_engine again;
    ecokv::run_eval(ecokv::plan_eval(f.o), again);
    EXPECT_TRUE(again.asked.empty());
    f.o.out_dir  = f.dir / "sharded";
    f.o.n_shards = 2;
    const ecokv::eval_plan shard0 = ecokv::plan_eval(f.o);
    EXPECT_EQ(shard0.conversations, (std::vector<size_t>{ 3, 1 }));
    ASSERT_EQ(shard0.items.size(), 4u);
    EXPECT_EQ(shard0.items[3].id, "c1");
}

TEST(eval_runner, turns_options_are_checked) {
    turns_fixture f;
    f.o.mode = ecokv::eval_mode::prompt;
    EXPECT_EQ(error_of([&] { ecokv::plan_eval(f.o); }),
              "--turns asks each question after the context is compressed: it takes --mode agnostic");
    f.o.mode                      = ecokv::eval_mode::agnostic;
    f.o.turns                     = false;
    f.o.settings.recompress_slack = 8;
    EXPECT_EQ(error_of([&] { ecokv::plan_eval(f.o); }),
              "--recompress-slack compresses a conversation again between its turns: it needs --turns");
    scripted_engine plain;  // an engine without the protocol says so
    EXPECT_EQ(error_of([&] { plain.converse({}, nullptr, 4); }), "this engine has no multi-turn protocol (--turns)");
}
