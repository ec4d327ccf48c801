// `ecokv eval` + `ecokv report` end to end on a tiny random-weight vision-language model and a 5-item fixture of
// the generated-suite layout written here: the table has every method x budget; a run killed midway and resumed,
// and a run split into shards, give the same table as one uninterrupted run.
#include "test-util.h"
#include "tiny-mmproj.h"
#include "tiny-model.h"

#include <gtest/gtest.h>
#include <llama.h>
#include <nlohmann/json.hpp>

#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace ecokv::test;
using json = nlohmann::json;

struct eval_fixture {
    temp_dir    dir;
    std::string model, mmproj, data;

    eval_fixture() {
        const tiny_vlm_files vlm = write_tiny_vlm(dir.path().string(), "qwen2vl", mmproj_type::qwen2vl_merger);
        model                    = vlm.model;
        mmproj                   = vlm.mmproj;
        data                     = dir / "data";
        fs::create_directories(data);
        std::string jsonl;
        for (int i = 0; i < 5; ++i) {
            write_test_ppm(data + "/img" + std::to_string(i) + ".ppm", 84 + 28 * (i % 2), 56, uint64_t(i + 1));
            jsonl += json{ { "id", "q" + std::to_string(i) }, { "image", { "img" + std::to_string(i) + ".ppm" } },
                           { "question", "what is written?" }, { "answers", { "a" + std::to_string(i) } }, { "type", "t" } }
                         .dump() +
                     "\n";
        }
        write_file(data + "/items.jsonl", jsonl);
    }

    run_result eval(const std::string & out, std::vector<std::string> extra) const {
        std::vector<std::string> args = { "eval", "--model", model, "--mmproj", mmproj, "--dataset", "generated", "--data",
                                          data, "--methods", "full,snapkv+ecokv,pyramidkv+ecokv", "--budgets", "16,10",
                                          "--window", "2", "-n", "4", "-t", "2", "--mode", "agnostic", "--out", out };
        args.insert(args.end(), extra.begin(), extra.end());
        return run_cli(dir.path().string(), args);
    }
    json report(const std::vector<std::string> & dirs) const {
        std::vector<std::string> args = { "report" };
        args.insert(args.end(), dirs.begin(), dirs.end());
        const run_result r = run_cli(dir.path().string(), args);
        EXPECT_EQ(r.code, 0) << describe(r);
        return json::parse(read_file(dirs.front() + "/report.json"));
    }
};

TEST(eval, resumed_and_sharded_runs_give_the_same_table) {
    const eval_fixture f;
    const std::string  single = f.dir / "single", resumed = f.dir / "resumed", s0 = f.dir / "s0", s1 = f.dir / "s1";
    ASSERT_EQ(f.eval(single, {}).code, 0);
    const json table = f.report({ single });
    ASSERT_TRUE(table.contains("generated"));
    // full at one budget column + 2 methods x 2 budgets, each over 5 items.
    ASSERT_EQ(table["generated"]["scores"].size(), 5u);
    for (const auto & s : table["generated"]["scores"]) {
        EXPECT_EQ(s["n"].get<int>(), 5);
    }

    // Killed after two items (and mid-line), then resumed.
    ASSERT_EQ(f.eval(resumed, { "--limit", "2" }).code, 0);
    std::string partial = read_file(resumed + "/results.jsonl");
    write_file(resumed + "/results.jsonl", partial + "{\"id\": \"q2\", \"meth");
    const run_result r = f.eval(resumed, {});
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_EQ(f.report({ resumed })["generated"], table["generated"]);

    // Two shards in two directories merge to the same table.
    ASSERT_EQ(f.eval(s0, { "--shard", "0/2" }).code, 0);
    ASSERT_EQ(f.eval(s1, { "--shard", "1/2" }).code, 0);
    EXPECT_EQ(f.report({ s0, s1 })["generated"], table["generated"]);
}

// --chunk: every compressed answer comes from its own chunked prefill (chunks of 6 cells: the 12-cell images alone),
// recorded with the full cache as the reference; config.json says so, and a method that cannot be chunked is refused
// before any work.
TEST(eval, chunked_runs_answer_every_method) {
    const eval_fixture f;
    const std::string  out = f.dir / "chunked";
    const run_result   r   = f.eval(out, { "--chunk", "6", "--limit", "2" });
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_EQ(json::parse(read_file(out + "/config.json"))["chunk"].get<int>(), 6);
    int                n = 0;
    std::istringstream lines(read_file(out + "/results.jsonl"));
    for (std::string line; std::getline(lines, line);) {
        const json rec = json::parse(line);
        EXPECT_FALSE(rec.contains("error")) << line;
        if (rec["method"] != "full") {
            EXPECT_TRUE(rec["mean_kl"].is_number()) << line;
            ++n;
        }
    }
    EXPECT_EQ(n, 2 * 2 * 2);  // 2 items x 2 methods x 2 budgets
    const run_result h2o = f.eval(f.dir / "chunked-h2o", { "--chunk", "6", "--methods", "h2o" });  // streamed
    EXPECT_EQ(h2o.code, 0) << describe(h2o);
    EXPECT_FALSE(contains(read_file(f.dir / "chunked-h2o/results.jsonl"), "\"error\"")) << "every item answered";
    const run_result small = f.eval(f.dir / "chunked-small", { "--chunk", "2" });
    EXPECT_TRUE(contains(small.err, "--chunk 2 must be larger than the window of 2")) << describe(small);
}

// Fidelity without gold answers: a budget covering the prompt leaves every layer's attention output unchanged;
// a small budget gives a per-layer error.
TEST(eval, fidelity_records_per_layer_attention_error) {
    const eval_fixture f;
    const std::string  out = f.dir / "fid";
    ASSERT_EQ(f.eval(out, { "--limit", "1", "--methods", "snapkv+ecokv", "--budgets", "4096,10" }).code, 0);
    std::istringstream lines(read_file(out + "/results.jsonl"));
    int                n = 0;
    for (std::string line; std::getline(lines, line); ++n) {
        const json r = json::parse(line);
        ASSERT_TRUE(r["attn_rel_error"].is_array()) << line;
        ASSERT_EQ(r["attn_rel_error"].size(), 2u);  // one per layer of the tiny model
        for (const json & e : r["attn_rel_error"]) {
            if (r["budget"] == 4096) {
                EXPECT_EQ(e.get<double>(), 0.0);
                EXPECT_EQ(r["agreement"].get<double>(), 1.0);
            } else {
                EXPECT_GE(e.get<double>(), 0.0);
            }
        }
    }
    EXPECT_EQ(n, 2);
}

// --metric replaces the dataset's own (exact for the generated suite) in the records, config.json and the
// report; a resume with another metric, or without the option, is refused, and so is a report mixing the two.
TEST(eval, metric_option_replaces_the_datasets) {
    const eval_fixture             f;
    const std::string              chars = f.dir / "chars", plain = f.dir / "plain";
    const std::vector<std::string> small = { "--limit", "1", "--methods", "full,snapkv+ecokv", "--budgets", "10" };
    const auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), small.begin(), small.end());
        return extra;
    };
    run_result r = f.eval(chars, with({ "--metric", "chars" }));
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_EQ(json::parse(read_file(chars + "/config.json"))["metric"], "chars");
    const std::string lines = read_file(chars + "/results.jsonl");
    const json        rec   = json::parse(lines.substr(0, lines.find('\n')));
    ASSERT_EQ(rec["method"], "full") << rec.dump();
    ASSERT_TRUE(rec["score"].is_number()) << rec.dump();
    const json table = f.report({ chars })["generated"];
    EXPECT_EQ(table["metric"], "chars");
    for (const json & s : table["scores"]) {
        if (s["method"] == "FullKV") {
            EXPECT_NEAR(s["score"].get<double>(), 100.0 * rec["score"].get<double>(), 1e-9) << table.dump();
        }
    }

    for (const std::vector<std::string> & extra : { with({ "--metric", "exact" }), small }) {
        r = f.eval(chars, extra);
        EXPECT_EQ(r.code, 1) << describe(r);
        EXPECT_TRUE(contains(r.err, "describes another run (metric \"chars\" there, \"exact\" here)")) << describe(r);
    }
    r = f.eval(chars, with({ "--metric", "chars" }));  // the same run resumes (nothing left to do)
    EXPECT_EQ(r.code, 0) << describe(r);

    ASSERT_EQ(f.eval(plain, small).code, 0);
    r = run_cli(f.dir.path().string(), { "report", chars, plain });
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_TRUE(contains(r.err, plain + ": generated scored with exact, but with chars in an earlier directory"))
        << describe(r);
}

// A last record without its newline is cut and computed again (it used to get the next record glued to it); a bad
// line before other records is refused with the file and line.
TEST(eval, resume_repairs_the_last_line_and_refuses_a_bad_middle) {
    const eval_fixture             f;
    const std::string              out   = f.dir / "glue";
    const std::vector<std::string> small = { "--methods", "full,snapkv+ecokv", "--budgets", "10" };
    const auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), small.begin(), small.end());
        return extra;
    };
    ASSERT_EQ(f.eval(out, with({ "--limit", "2" })).code, 0);
    std::string text = read_file(out + "/results.jsonl");
    ASSERT_EQ(text.back(), '\n');
    write_file(out + "/results.jsonl", text.substr(0, text.size() - 1));  // truncate -s -1
    const run_result r = f.eval(out, with({ "--limit", "3" }));
    ASSERT_EQ(r.code, 0) << describe(r);
    std::istringstream lines(read_file(out + "/results.jsonl"));
    int                n = 0;
    for (std::string line; std::getline(lines, line); ++n) {
        EXPECT_NO_THROW(json::parse(line)) << line;
    }
    EXPECT_EQ(n, 6);  // 3 items x (full + one method), each once

    text = read_file(out + "/results.jsonl");
    write_file(out + "/results.jsonl", "{\"id\": \"x\"\n" + text);
    const run_result bad = f.eval(out, with({ "--limit", "3" }));
    EXPECT_EQ(bad.code, 1);
    EXPECT_TRUE(contains(bad.err, out + "/results.jsonl:1: not a results record")) << describe(bad);
}

// An item that cannot be processed (a literal media marker in its question, in prompt mode) is recorded with its
// reason for every method, the other items are answered, the report counts it; --strict stops at it instead.
TEST(eval, a_bad_item_is_recorded_and_the_run_goes_on) {
    const eval_fixture f;
    std::string        jsonl = read_file(f.data + "/items.jsonl");
    const size_t       at    = jsonl.find("what is written?", jsonl.find("\"q1\""));
    jsonl.replace(at, 16, "what is <__media__> here?");
    const std::string data = f.dir / "bad-data";
    fs::create_directories(data);
    for (const auto & e : fs::directory_iterator(f.data)) {
        fs::copy(e.path(), data + "/" + e.path().filename().string());
    }
    write_file(data + "/items.jsonl", jsonl);
    const std::string out  = f.dir / "bad";
    auto              args = [&](bool strict) {
        std::vector<std::string> a = { "eval", "--model", f.model, "--mmproj", f.mmproj, "--dataset", "generated",
                                       "--data", data, "--methods", "full,snapkv+ecokv", "--budgets", "10", "--window",
                                       "2", "-n", "2", "-t", "2", "--mode", "prompt", "--limit", "3", "--out", out };
        if (strict) {
            a.push_back("--strict");
        }
        return a;
    };
    const run_result strict = run_cli(f.dir.path().string(), args(true));
    EXPECT_EQ(strict.code, 1) << describe(strict);
    EXPECT_TRUE(contains(strict.err, "item 'q1': the prompt holds 2 media markers (<__media__>) for 1 image"))
        << describe(strict);
    const run_result r = run_cli(f.dir.path().string(), args(false));
    ASSERT_EQ(r.code, 0) << describe(r);
    std::istringstream lines(read_file(out + "/results.jsonl"));
    int                n = 0, failed = 0;
    for (std::string line; std::getline(lines, line); ++n) {
        const json rec = json::parse(line);
        if (rec["id"] == "q1") {
            EXPECT_TRUE(contains(rec["error"].get<std::string>(), "2 media markers")) << line;
            ++failed;
        } else {
            EXPECT_TRUE(rec["prediction"].is_string()) << line;
        }
    }
    EXPECT_EQ(n, 6);
    EXPECT_EQ(failed, 2);
    const json table = f.report({ out })["generated"];
    ASSERT_EQ(table["failed"].size(), 2u) << table.dump();
    EXPECT_EQ(table["failed"][0]["n"], 1);
    for (const json & row : table["scores"]) {
        EXPECT_EQ(row["n"], 2) << "scores over the items that could be processed";
    }
}

// One writer per directory: a live holder of <out>/lock is named and refused; a lock file left behind is taken over.
TEST(eval, one_writer_per_directory) {
    const eval_fixture             f;
    const std::string              out   = f.dir / "locked";
    const std::vector<std::string> small = { "--limit", "1", "--methods", "full", "--budgets", "10" };
    fs::create_directories(out);
    const int fd = ::open((out + "/lock").c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    ASSERT_EQ(::write(fd, "4242", 4), 4);
    const run_result busy = f.eval(out, small);
    EXPECT_EQ(busy.code, 1) << describe(busy);
    EXPECT_TRUE(contains(busy.err, out + " is being written by another ecokv eval (pid 4242)")) << describe(busy);
    EXPECT_FALSE(fs::exists(out + "/results.jsonl"));
    ::close(fd);  // as if that process died: its file stays, its lock does not
    const run_result r = f.eval(out, small);
    EXPECT_EQ(r.code, 0) << describe(r);
}

// A full disk (here a file-size limit, with SIGXFSZ ignored so that writes fail with EFBIG): eval stops with a clear
// error, leaves only whole records, and a resume without the limit completes the same table as one run.
TEST(eval, a_failed_write_stops_cleanly_and_resumes) {
    const eval_fixture f;
    const std::string  out = f.dir / "full";
    std::string        cmd = "ulimit -f 3; trap '' XFSZ; exec " + quote(ECOKV_CLI);
    for (const std::string & a : { "eval", "--model", f.model.c_str(), "--mmproj", f.mmproj.c_str(), "--dataset",
                                   "generated", "--data", f.data.c_str(), "--methods", "full,snapkv+ecokv", "--budgets",
                                   "16,10", "--window", "2", "-n", "4", "-t", "2", "--mode", "agnostic", "--out",
                                   out.c_str() }) {
        cmd += " " + quote(a);
    }
    const std::string err    = f.dir / "full.err";
    const int         status = std::system(("bash -c " + quote(cmd) + " 2>" + quote(err)).c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 1);
    EXPECT_TRUE(contains(read_file(err), "/results.jsonl: cannot write a result (File too large)")) << read_file(err);
    const std::string partial = read_file(out + "/results.jsonl");
    ASSERT_FALSE(partial.empty());
    EXPECT_EQ(partial.back(), '\n');
    EXPECT_LE(partial.size(), 3u * 1024u);
    std::istringstream lines(partial);
    for (std::string line; std::getline(lines, line);) {
        EXPECT_NO_THROW(json::parse(line)) << line;
    }
    ASSERT_EQ(f.eval(out, {}).code, 0);
    const std::string single = f.dir / "single";
    ASSERT_EQ(f.eval(single, {}).code, 0);
    EXPECT_EQ(f.report({ out })["generated"], f.report({ single })["generated"]);
}

// Every option that changes results is in config.json: resuming with another window, alpha or n-predict is refused.
TEST(eval, resuming_with_other_method_options_is_refused) {
    const eval_fixture             f;
    const std::string              out   = f.dir / "opts";
    const std::vector<std::string> small = { "--limit", "1", "--methods", "snapkv+ecokv", "--budgets", "10" };
    const auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), small.begin(), small.end());
        return extra;
    };
    ASSERT_EQ(f.eval(out, small).code, 0);
    const json config = json::parse(read_file(out + "/config.json"));
    EXPECT_EQ(config["window"], 2);
    EXPECT_EQ(config["alpha"], 0.8);
    EXPECT_EQ(config["n_predict"], 4);
    EXPECT_EQ(config["model_hash"].get<std::string>().size(), 16u);  // by content: a same-named other model differs
    EXPECT_EQ(config["mmproj_hash"].get<std::string>().size(), 16u);
    const std::string first = read_file(out + "/results.jsonl");
    EXPECT_EQ(json::parse(first.substr(0, first.find('\n')))["config"].get<std::string>().size(), 16u);
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        { with({ "--window", "3" }), "describes another run (window 2 there, 3 here)" },
        { with({ "--alpha", "0.5" }), "describes another run (alpha 0.8 there, 0.5 here)" },
        { with({ "--kernel", "7" }), "describes another run (kernel 5 there, 7 here)" },
        { with({ "-n", "5" }), "describes another run (n_predict 4 there, 5 here)" },
        { with({ "--model", f.dir / "other/" + fs::path(f.model).filename().string() }),
          "describes another run (model_hash " },
    };
    const std::string other = f.dir / "other/" + fs::path(f.model).filename().string();
    fs::create_directories(f.dir / "other");
    fs::copy_file(f.model, other);
    {  // the same file name in another place, other bytes
        std::fstream g(other, std::ios::in | std::ios::out | std::ios::binary);
        g.seekp(-1, std::ios::end);
        g.put('\x7f');
    }
    for (const auto & [extra, message] : cases) {
        const run_result r = f.eval(out, extra);  // later options win over the fixture's
        EXPECT_EQ(r.code, 1) << describe(r);
        EXPECT_TRUE(contains(r.err, message)) << describe(r);
    }
}

// --image-max-tokens N is part of the run (config.json; a resume with another N is refused), and report shows its full
// cache as the smaller-image baseline in budget N's column.
TEST(eval, image_max_tokens_is_the_smaller_image_baseline) {
    const eval_fixture f;
    const std::string  out  = f.dir / "small";
    const std::vector<std::string> args = { "--methods", "full", "--budgets", "9", "--image-max-tokens", "9" };
    const run_result   r    = f.eval(out, args);
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_EQ(json::parse(read_file(out + "/config.json"))["image_max_tokens"], 9);
    const run_result again = f.eval(out, { "--methods", "full", "--budgets", "9", "--image-max-tokens", "10" });
    EXPECT_EQ(again.code, 1) << describe(again);
    EXPECT_TRUE(contains(again.err, "image_max_tokens 9 there, 10 here")) << describe(again);
    const json table = f.report({ out })["generated"];
    ASSERT_EQ(table["scores"].size(), 1u) << table.dump();
    EXPECT_EQ(table["scores"][0]["method"], "FullKV, smaller image");
    EXPECT_EQ(table["scores"][0]["budget"], 9);
}

TEST(eval, bad_options_are_rejected) {
    const eval_fixture f;
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        { { "--shard", "2/2" }, "--shard '2/2' must be i/n" },
        { { "--mode", "bogus" }, "--mode must be prompt or agnostic" },
        { { "--metric", "nosuch" }, "ecokv eval: error: unknown metric 'nosuch'; known: exact, " },
        { { "--methods", "," }, "--methods names no method" },
        { { "--budgets", "99999999999" }, "--budgets: '99999999999' is not an integer in [-2147483648, 2147483647]" },
    };
    for (const auto & [extra, message] : cases) {
        const run_result r = f.eval(f.dir / "bad", extra);
        EXPECT_EQ(r.code, 1) << describe(r);
        EXPECT_TRUE(contains(r.err, message)) << describe(r);
    }
    const run_result r = run_cli(f.dir.path().string(), { "eval", "--model", f.model, "--dataset", "nope", "--methods",
                                                           "full", "--out", f.dir / "x" });
    EXPECT_EQ(r.code, 1);
    EXPECT_TRUE(contains(r.err, "unknown dataset 'nope'")) << describe(r);
}

}  // namespace
