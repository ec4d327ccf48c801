// The `ecokv` binary end to end: help and usage, synth-capture, compress, report, and every user error: exit
// status 1, a message naming the file/option/tensor at fault on stderr, and no output file (nor temporary) left behind.
#include "test-util.h"
#include "ecokv/ecokv.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace {

using namespace ecokv::test;
using json = nlohmann::json;

// The capture every compress test reads: L 2, H 4, Hkv 2, D 8, Dv 8, T 96, Nq 32.
constexpr int32_t k_layers = 2, k_heads = 4, k_kv_heads = 2, k_dim = 8, k_tokens = 96, k_queries = 32;

ecokv::synth_params fixture_params(bool full_queries) {
    ecokv::synth_params p;
    p.n_layers     = k_layers;
    p.n_heads      = k_heads;
    p.n_kv_heads   = k_kv_heads;
    p.head_dim     = k_dim;
    p.n_tokens     = k_tokens;
    p.n_queries    = k_queries;
    p.full_queries = full_queries;
    p.seed         = 11;
    p.image_spans  = { { 20, 50 } };
    return p;
}

// A test directory with io/ (captured stdout/stderr), in/ (inputs) and out/ (where outputs go; starts empty).
struct cli_fixture {
    temp_dir    dir;
    std::string io, in, out;
    std::string capture;       // window queries only
    std::string capture_full;  // with full queries (h2o, lookm)

    cli_fixture() : io(dir / "io"), in(dir / "in"), out(dir / "out") {
        fs::create_directories(io);
        fs::create_directories(in);
        fs::create_directories(out);
        capture      = in + "/cap.safetensors";
        capture_full = in + "/cap-full.safetensors";
        ecokv::write_capture(capture, ecokv::make_synth_capture(fixture_params(false)).view());
        ecokv::write_capture(capture_full, ecokv::make_synth_capture(fixture_params(true)).view());
    }

    run_result run(const std::vector<std::string> & args) const { return run_cli(io, args); }

    // A head-score file in the official format, with every (layer, query head) but those in `skip`.
    std::string head_scores(const std::string & name, const std::set<std::string> & skip = {}) const {
        json j = json::object();
        for (int l = 0; l < k_layers; ++l) {
            for (int h = 0; h < k_heads; ++h) {
                const std::string key = std::to_string(l) + "-" + std::to_string(h);
                if (!skip.count(key)) {
                    j[key] = { 0.5 + 0.1 * h, 1.0 + 0.2 * l, 0.25 };
                }
            }
        }
        const std::string path = in + "/" + name;
        write_file(path, j.dump());
        return path;
    }
};

// The fixture's capture with one NaN in layers.0.keys (head 1, token 40, channel 3), written by the library.
std::string write_nan_capture(const std::string & path) {
    const ecokv::owned_capture cap = ecokv::make_synth_capture(fixture_params(false));
    ecokv::capture_view        v   = cap.view();
    const ecokv::tensor_view & k   = v.layers[0].keys;
    std::vector<float>         keys(size_t(k.n_elements()));
    std::memcpy(keys.data(), k.data, keys.size() * sizeof(float));
    keys[(size_t(1) * k_tokens + 40) * k_dim + 3] = std::numeric_limits<float>::quiet_NaN();
    v.layers[0].keys = ecokv::tensor_view::packed(keys.data(), ecokv::dtype::f32, { k_kv_heads, k_tokens, k_dim });
    ecokv::write_capture(path, v);
    return path;
}

// ---------------------------------------------------------------------------------------------------------------
// help and usage

TEST(cli, help_exits_zero) {
    temp_dir dir;
    for (const char * flag : { "--help", "-h" }) {
        const run_result r = run_cli(dir.path().string(), { flag });
        EXPECT_EQ(r.code, 0) << describe(r);
        EXPECT_TRUE(contains(r.out, "usage: ecokv")) << describe(r);
        EXPECT_TRUE(contains(r.out, "compress")) << describe(r);
        EXPECT_TRUE(contains(r.out, "synth-capture")) << describe(r);
    }
    run_result r = run_cli(dir.path().string(), { "compress", "--help" });
    EXPECT_EQ(r.code, 0) << describe(r);
    for (const char * opt : { "--input", "--output", "--method", "--budget", "--window", "--kernel", "--head-scores",
                              "--merge", "--list-methods" }) {
        EXPECT_TRUE(contains(r.out, opt)) << opt << "\n" << describe(r);
    }
    r = run_cli(dir.path().string(), { "synth-capture", "--help" });
    EXPECT_EQ(r.code, 0) << describe(r);
    for (const char * opt : { "--layers", "--heads", "--kv-heads", "--tokens", "--image-tokens", "--full-queries",
                              "--dtype", "--output" }) {
        EXPECT_TRUE(contains(r.out, opt)) << opt << "\n" << describe(r);
    }
}

TEST(cli, no_command_or_unknown_command_exits_one_with_usage) {
    temp_dir   dir;
    run_result r = run_cli(dir.path().string(), {});
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_TRUE(contains(r.err, "usage: ecokv")) << describe(r);
    EXPECT_TRUE(r.out.empty()) << describe(r);

    r = run_cli(dir.path().string(), { "bogus" });
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_TRUE(contains(r.err, "unknown command 'bogus'")) << describe(r);
    EXPECT_TRUE(contains(r.err, "usage: ecokv")) << describe(r);

    r = run_cli(dir.path().string(), { "--bogus" });
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_TRUE(contains(r.err, "usage: ecokv")) << describe(r);

    // An unknown option of 5000 bytes is named by its start and end, not echoed whole.
    const std::string long_option = "--a" + std::string(4996, 'x') + "z";
    r = run_cli(dir.path().string(), { "run", long_option });
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_TRUE(contains(r.err, "ecokv run: error: Option \xe2\x80\x98" "axxx")) << describe(r);
    EXPECT_TRUE(contains(r.err, "xxx...xxx")) << describe(r);
    EXPECT_TRUE(contains(r.err, "xxxz\xe2\x80\x99 does not exist (see --help)")) << describe(r);
    EXPECT_LT(r.err.size(), 220u) << describe(r);
}

TEST(cli, list_methods_lists_every_registered_name) {
    temp_dir         dir;
    const run_result r = run_cli(dir.path().string(), { "compress", "--list-methods" });
    ASSERT_EQ(r.code, 0) << describe(r);
    std::set<std::string> first_words;
    std::istringstream    lines(r.out);
    for (std::string line; std::getline(lines, line);) {
        first_words.insert(line.substr(0, line.find(' ')));
    }
    const auto methods = ecokv::list_methods();
    EXPECT_GE(methods.size(), 17u);
    for (const ecokv::method_info & m : methods) {
        EXPECT_TRUE(first_words.count(m.name)) << m.name << "\n" << describe(r);
        EXPECT_TRUE(contains(r.out, m.description)) << m.name;
    }
    // A few by name, as the SPEC lists them.
    for (const char * name : { "snapkv", "ecokv", "h2o", "uniform", "pyramidkv", "adakv", "sparsemm", "lookm" }) {
        EXPECT_TRUE(first_words.count(name)) << name;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// synth-capture

TEST(cli, synth_capture_writes_the_requested_capture) {
    temp_dir          dir;
    const std::string path = dir / "cap.safetensors";
    const run_result  r    = run_cli(dir.path().string(),
                                     { "synth-capture", "--layers", "3", "--heads", "6", "--kv-heads", "2", "--head-dim", "16",
                                       "--head-dim-v", "12", "--tokens", "100", "--queries", "40", "--image-tokens", "10:20",
                                       "--image-tokens", "50:55", "--full-queries", "--dtype", "f16", "--seed", "3", "-o",
                                       path });
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_TRUE(contains(r.out, path)) << describe(r);
    const auto   f = ecokv::capture_file::open(path);
    const auto & v = f.view();
    EXPECT_EQ(v.n_layers, 3);
    EXPECT_EQ(v.n_heads, 6);
    EXPECT_EQ(v.n_kv_heads, 2);
    EXPECT_EQ(v.head_dim, 16);
    EXPECT_EQ(v.head_dim_v, 12);
    EXPECT_EQ(v.n_tokens, 100);
    EXPECT_EQ(v.n_queries, 40);
    EXPECT_TRUE(v.has_full_queries());
    EXPECT_EQ(v.layers[2].keys.type, ecokv::dtype::f16);
    EXPECT_EQ(v.layers[2].full_queries.ne, (std::array<int64_t, 4>{ 16, 100, 6, 1 }));
    std::vector<uint8_t> modality(100, 0);
    for (int t = 10; t < 20; ++t) {
        modality[size_t(t)] = 1;
    }
    for (int t = 50; t < 55; ++t) {
        modality[size_t(t)] = 1;
    }
    EXPECT_EQ(v.modality, modality);
    EXPECT_EQ(f.metadata().at("seed"), "3");
    EXPECT_NO_THROW(v.check_finite());
    EXPECT_EQ(list_dir(dir.path().string()).count("cap.safetensors"), 1u);

    // The defaults, and the same bytes on a second run.
    const std::string a = dir / "a.safetensors", b = dir / "b.safetensors";
    ASSERT_EQ(run_cli(dir.path().string(), { "synth-capture", "--tokens", "64", "-o", a }).code, 0);
    ASSERT_EQ(run_cli(dir.path().string(), { "synth-capture", "--tokens", "64", "-o", b }).code, 0);
    EXPECT_EQ(read_file(a), read_file(b));
    const auto d = ecokv::capture_file::open(a);
    EXPECT_EQ(d.view().n_layers, 4);
    EXPECT_EQ(d.view().n_heads, 8);
    EXPECT_EQ(d.view().n_kv_heads, 4);
    EXPECT_EQ(d.view().head_dim, 64);
    EXPECT_EQ(d.view().head_dim_v, 64);
    EXPECT_EQ(d.view().n_queries, 32);
    EXPECT_EQ(d.view().layers[0].keys.type, ecokv::dtype::f32);
    EXPECT_FALSE(d.view().has_full_queries());
    EXPECT_TRUE(d.view().modality.empty());
}

TEST(cli, synth_capture_bad_options) {
    struct bad {
        std::vector<std::string> args;
        std::string              message;
    };
    const std::vector<bad> cases = {
        { { "--heads", "6", "--kv-heads", "4" }, "--heads 6" },
        { { "--tokens", "16", "--queries", "32" }, "--queries 32" },
        { { "--image-tokens", "5-9" }, "--image-tokens '5-9'" },
        { { "--image-tokens", "30:600" }, "--image-tokens 30:600" },
        { { "--dtype", "bf16" }, "--dtype" },
        { { "--head-dim", "7" }, "--head-dim 7" },
        { { "--head-dim-v=-3" }, "--head-dim-v -3" },
        { { "--layers", "0" }, "--layers 0" },
        // 1000 layers x (4 KV heads x 2000000 tokens x (64 + 64) + 8 heads x 32 queries x 64): bounded before allocating
        { { "--layers", "1000", "--tokens", "2000000" }, "the capture would hold 1.02e+12 values" },
        { { "--layers", "two" }, "two" },
        { { "--bogus" }, "bogus" },
        { { "stray" }, "unexpected argument 'stray'" },
    };
    temp_dir          dir;
    const std::string io = dir / "io", out = dir / "out";
    fs::create_directories(io);
    fs::create_directories(out);
    const std::string path = out + "/cap.safetensors";
    for (const bad & c : cases) {
        std::vector<std::string> args = { "synth-capture", "-o", path };
        args.insert(args.end(), c.args.begin(), c.args.end());
        SCOPED_TRACE(c.message);
        const run_result r = run_cli(io, args);
        EXPECT_EQ(r.code, 1) << describe(r);
        EXPECT_TRUE(contains(r.err, "ecokv synth-capture: error:")) << describe(r);
        EXPECT_TRUE(contains(r.err, c.message)) << describe(r);
        EXPECT_TRUE(list_dir(out).empty());
    }
    const run_result r = run_cli(io, { "synth-capture" });
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_TRUE(contains(r.err, "missing --output")) << describe(r);
    // Into a directory that does not exist: nothing is created.
    const run_result r2 = run_cli(io, { "synth-capture", "-o", out + "/sub/cap.safetensors" });
    EXPECT_EQ(r2.code, 1) << describe(r2);
    EXPECT_TRUE(contains(r2.err, out + "/sub/cap.safetensors")) << describe(r2);
    EXPECT_TRUE(list_dir(out).empty());
}

// ---------------------------------------------------------------------------------------------------------------
// compress

// Checks the selection JSON of a uniform method: every head keeps min(T, B) ascending tokens, the last N included.
void check_uniform_selection(const json & j, const std::string & method, int32_t budget, int32_t window) {
    SCOPED_TRACE(method);
    EXPECT_EQ(j["method"], method);
    EXPECT_EQ(j["budget"], budget);
    EXPECT_EQ(j["window"], window);
    EXPECT_EQ(j["n_tokens"], k_tokens);
    // By hand: 2 layers * 2 KV heads * 96 tokens * (8 * 4 + 8 * 4) bytes (F32 keys and values).
    EXPECT_EQ(j["kv_bytes_full"].get<uint64_t>(), 24576u);
    const size_t n_keep = size_t(std::min(k_tokens, budget));
    EXPECT_EQ(j["kv_bytes_kept"].get<uint64_t>(), uint64_t(k_layers) * k_kv_heads * n_keep * 64);
    ASSERT_EQ(j["layers"].size(), size_t(k_layers));
    for (const json & layer : j["layers"]) {
        ASSERT_EQ(layer["heads"].size(), size_t(k_kv_heads));
        for (const json & h : layer["heads"]) {
            const auto kept = h.get<std::vector<int32_t>>();
            ASSERT_EQ(kept.size(), n_keep);
            for (size_t i = 1; i < kept.size(); ++i) {
                EXPECT_LT(kept[i - 1], kept[i]);
            }
            EXPECT_GE(kept.front(), 0);
            EXPECT_LT(kept.back(), k_tokens);
            for (int32_t t = k_tokens - window; t < k_tokens; ++t) {
                EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), t)) << "window token " << t;
            }
        }
    }
}

// ecokv analyze on the fixture capture: one entry per (layer, KV head); the pairwise mean cosine over every key equals
// rC, computed by the kernel from the normalised keys' mean; the window is kept by every head; bad input refused.
TEST(cli, analyze_writes_the_analysis) {
    cli_fixture      fx;
    const run_result r = fx.run({ "analyze", "-i", fx.capture, "-m", "snapkv+ecokv", "-b", "40", "--bins", "8",
                                  "--out", fx.out + "/an", "-t", "2" });
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_TRUE(contains(r.out, "layer  mean cos")) << describe(r);
    const json a = json::parse(read_file(fx.out + "/an/analysis.json"));
    EXPECT_EQ(a["n_tokens"], k_tokens);
    EXPECT_EQ(a["method"], "uniform+ecokv");
    ASSERT_EQ(a["heads"].size(), size_t(k_layers * k_kv_heads));
    ASSERT_EQ(a["layers"].size(), size_t(k_layers));
    for (const json & h : a["heads"]) {
        EXPECT_EQ(h["n_pair_keys"], k_tokens);
        EXPECT_NEAR(h["r_c"].get<double>(), h["pair_cos_mean"].get<double>(), 1e-6);
        double total = 0;
        for (const json & b : h["cos_hist"]) {
            total += b.get<double>();
        }
        EXPECT_NEAR(total, 1.0, 1e-12);
        EXPECT_EQ(h["cos_hist"].size(), 8u);
    }
    ASSERT_EQ(a["recent_kept"].size(), 32u);
    for (size_t i = 28; i < 32; ++i) {  // ECOKV's window of 4
        EXPECT_EQ(a["recent_kept"][i], 1.0) << i;
    }
    double kept = 0;  // every head keeps exactly its budget of 40
    for (const json & k : a["kept_share"]) {
        kept += k.get<double>();
    }
    EXPECT_NEAR(kept, 40.0, 1e-9);
    // The figures (scripts/plot-analysis.py), or a note that python3 lacks matplotlib; a capture has no image.
    if (contains(r.out, "plots skipped")) {
        EXPECT_TRUE(contains(r.out, "matplotlib")) << describe(r);
    } else {
        for (const char * png : { "key-cosine.png", "redundancy.png", "correlation.png", "recent-kept.png" }) {
            EXPECT_EQ(read_file(fx.out + "/an/" + png).substr(0, 8), "\x89PNG\r\n\x1a\n") << png << "\n" << describe(r);
        }
        EXPECT_FALSE(fs::exists(fx.out + "/an/kept-map-0.png"));
    }

    const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
        { { "analyze", "-i", fx.capture, "-m", "snapkv" }, "--out" },
        { { "analyze", "-i", fx.in + "/none.safetensors", "--out", fx.out + "/x" }, "none.safetensors" },
        { { "analyze", "-i", fx.capture, "--bins", "0", "--out", fx.out + "/x" }, "--bins 0" },
        { { "analyze", "-i", fx.capture, "-m", "nosuch", "--out", fx.out + "/x" }, "nosuch" },
        { { "analyze", "-i", fx.capture, "-p", "hello", "--out", fx.out + "/x" }, "--input analyses a capture file; --prompt" },
    };
    for (const auto & [args, message] : bad) {
        const run_result e = fx.run(args);
        EXPECT_EQ(e.code, 1) << describe(e);
        EXPECT_TRUE(contains(e.err, message)) << message << "\n" << describe(e);
    }
    EXPECT_FALSE(fs::exists(fx.out + "/x"));
}

TEST(cli, compress_writes_the_selection) {
    cli_fixture fx;
    struct ok_case {
        std::string method, canonical;
        int32_t     budget, window;
    };
    const std::vector<ok_case> cases = {
        { "snapkv", "uniform+snapkv", 40, 8 },       { "knorm", "uniform+knorm", 24, 4 },
        { "snapkv+ecokv", "uniform+ecokv", 40, 4 },  { "random", "uniform+random", 33, 32 },
        { "uniform+keydiff", "uniform+keydiff", 60, 16 },
        { "snapkv", "uniform+snapkv", 96, 8 },       // B = T: everything
        { "snapkv", "uniform+snapkv", 200, 8 },      // B > T: everything
    };
    for (const ok_case & c : cases) {
        const std::string out = fx.out + "/sel.json";
        const run_result  r   = fx.run({ "compress", "-i", fx.capture, "-m", c.method, "-b", std::to_string(c.budget),
                                         "--window", std::to_string(c.window), "-o", out, "-t", "2" });
        ASSERT_EQ(r.code, 0) << c.method << "\n" << describe(r);
        EXPECT_TRUE(contains(r.out, out)) << describe(r);
        check_uniform_selection(json::parse(read_file(out)), c.canonical, c.budget, c.window);
        EXPECT_EQ(list_dir(fx.out), (std::set<std::string>{ "sel.json" }));
    }
    // The scorer's default window (snapkv: 32) and --quiet.
    const std::string out = fx.out + "/sel.json";
    const run_result  r   = fx.run({ "compress", "-q", "-i", fx.capture, "-m", "snapkv", "-b", "48", "-o", out });
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_TRUE(r.out.empty()) << describe(r);
    EXPECT_TRUE(r.err.empty()) << describe(r);
    check_uniform_selection(json::parse(read_file(out)), "uniform+snapkv", 48, 32);
}

TEST(cli, compress_full_query_methods_and_merged_rows) {
    cli_fixture       fx;
    const std::string out = fx.out + "/sel.json", merged = fx.out + "/merged.safetensors";
    run_result        r = fx.run({ "compress", "-i", fx.capture_full, "-m", "h2o", "-b", "40", "--window", "8", "-o", out });
    ASSERT_EQ(r.code, 0) << describe(r);
    check_uniform_selection(json::parse(read_file(out)), "uniform+h2o", 40, 8);

    r = fx.run({ "compress", "-i", fx.capture_full, "-m", "lookm", "-b", "40", "--window", "8", "--merge", "pivot",
                 "--merged-output", merged, "-o", out });
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_EQ(list_dir(fx.out), (std::set<std::string>{ "sel.json", "merged.safetensors" }));
    const json j = json::parse(read_file(out));
    EXPECT_EQ(j["method"], "lookm+h2o");
    const auto m = ecokv::safetensors_file::open(merged);
    EXPECT_EQ(m.tensors().size(), size_t(2 * k_layers * k_kv_heads));
    for (int l = 0; l < k_layers; ++l) {
        for (int g = 0; g < k_kv_heads; ++g) {
            const std::string p    = "layers." + std::to_string(l) + ".heads." + std::to_string(g) + ".";
            const int64_t     kept = int64_t(j["layers"][l]["heads"][g].size());
            ASSERT_NE(m.find(p + "keys"), nullptr) << p;
            ASSERT_NE(m.find(p + "values"), nullptr) << p;
            EXPECT_EQ(m.find(p + "keys")->shape, (std::vector<int64_t>{ kept, k_dim }));
            EXPECT_EQ(m.find(p + "values")->shape, (std::vector<int64_t>{ kept, k_dim }));
            EXPECT_EQ(m.find(p + "keys")->type, ecokv::dtype::f32);
        }
    }
}

TEST(cli, compress_sparsemm_with_head_scores) {
    cli_fixture       fx;
    const std::string out = fx.out + "/sel.json";
    const run_result  r   = fx.run({ "compress", "-i", fx.capture, "-m", "sparsemm", "-b", "40", "--window", "8",
                                     "--head-scores", fx.head_scores("hs.json"), "-o", out });
    ASSERT_EQ(r.code, 0) << describe(r);
    const json j = json::parse(read_file(out));
    EXPECT_EQ(j["method"], "sparsemm+snapkv");
    for (const json & layer : j["layers"]) {
        for (const json & h : layer["heads"]) {
            const auto kept = h.get<std::vector<int32_t>>();
            EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
            EXPECT_GE(kept.size(), 8u);  // the window at least
            EXPECT_EQ(kept.back(), k_tokens - 1);
        }
    }
}

struct bad_compress {
    std::string              name;
    std::vector<std::string> args;      // besides -o OUTPUT (added unless `no_output`)
    std::vector<std::string> messages;  // substrings of stderr
    bool                     no_output = false;
};

TEST(cli, compress_bad_input_exits_one_and_writes_nothing) {
    cli_fixture fx;
    // Inputs prepared once.
    const std::string missing   = fx.in + "/absent.safetensors";
    const std::string truncated = fx.in + "/truncated.safetensors";
    {
        const std::string bytes = read_file(fx.capture);
        write_file(truncated, bytes.substr(0, bytes.size() / 2));
    }
    const std::string stub = fx.in + "/stub.safetensors";
    write_file(stub, read_file(fx.capture).substr(0, 20));
    const std::string text = fx.in + "/notes.txt";
    write_file(text, "not a capture at all\n");
    const std::string nan_capture = write_nan_capture(fx.in + "/nan.safetensors");
    const std::string no_file_hs  = fx.in + "/no-such-scores.json";
    const std::string partial_hs  = fx.head_scores("partial.json", { "1-3" });
    const std::string bad_json_hs = fx.in + "/broken.json";
    write_file(bad_json_hs, "{\"0-0\": [1, 2,");
    const std::string cap = fx.capture;

    const std::vector<bad_compress> cases = {
        { "missing input", { "-i", missing, "-m", "snapkv" }, { missing, "cannot open" } },
        { "truncated capture", { "-i", truncated, "-m", "snapkv" }, { truncated, "truncated" } },
        { "capture cut in its header", { "-i", stub, "-m", "snapkv" }, { stub, "header length" } },
        { "text file", { "-i", text, "-m", "snapkv" }, { text } },
        { "capture is a directory", { "-i", fx.in, "-m", "snapkv" }, { fx.in } },
        { "NaN in keys", { "-i", nan_capture, "-m", "snapkv", "-b", "40", "--window", "8" }, { "layers.0.keys", "NaN" } },
        { "NaN in keys, budget covers T", { "-i", nan_capture, "-m", "snapkv", "-b", "200", "--window", "8" },
          { "layers.0.keys" } },
        { "unknown method", { "-i", cap, "-m", "bogus" }, { "unknown method 'bogus'", "snapkv", "ecokv", "lookm" } },
        { "unknown scorer", { "-i", cap, "-m", "uniform+bogus" }, { "bogus", "snapkv" } },
        { "unknown allocator", { "-i", cap, "-m", "bogus+snapkv" }, { "bogus", "pyramidkv" } },
        { "budget equals window", { "-i", cap, "-m", "snapkv", "-b", "8", "--window", "8" }, { "--budget 8", "--window 8" } },
        { "budget below window", { "-i", cap, "-m", "snapkv", "-b", "4", "--window", "8" }, { "--budget 4", "--window 8" } },
        { "budget below default window", { "-i", cap, "-m", "snapkv", "-b", "16" }, { "--budget 16", "--window 32" } },
        { "window zero", { "-i", cap, "-m", "snapkv", "--window", "0" }, { "--window 0" } },
        { "even kernel", { "-i", cap, "-m", "snapkv", "--kernel", "4" }, { "--kernel 4" } },
        { "bogus pool", { "-i", cap, "-m", "snapkv", "--pool", "bogus" }, { "--pool", "bogus" } },
        { "bogus merge", { "-i", cap, "-m", "lookm", "--merge", "all" }, { "--merge", "all" } },
        { "bogus centroid", { "-i", cap, "-m", "ecokv", "--centroid", "mid" }, { "--centroid", "mid" } },
        { "bogus mixkv scale", { "-i", cap, "-m", "mixkv", "--mixkv-scale", "sv" }, { "--mixkv-scale", "'sv'" } },
        { "bogus ecokv weights", { "-i", cap, "-m", "ecokv", "--ecokv-weights", "fig3" }, { "--ecokv-weights", "'fig3'" } },
        { "alpha out of range", { "-i", cap, "-m", "ecokv", "--alpha", "1.5" }, { "--alpha 1.5" } },
        { "negative floor ratio", { "-i", cap, "-m", "adakv", "--floor-ratio", "-0.1" }, { "--floor-ratio" } },
        { "budget not a number", { "-i", cap, "-m", "snapkv", "-b", "many" }, { "many" } },
        { "sparsemm without head scores", { "-i", cap, "-m", "sparsemm", "-b", "40", "--window", "8" },
          { "--head-scores" } },
        { "sparsemm missing head-score file",
          { "-i", cap, "-m", "sparsemm", "-b", "40", "--window", "8", "--head-scores", no_file_hs },
          { no_file_hs, "cannot open" } },
        { "head-score file missing an entry",
          { "-i", cap, "-m", "sparsemm", "-b", "40", "--window", "8", "--head-scores", partial_hs },
          { partial_hs, "\"1-3\"" } },
        { "head-score file not JSON",
          { "-i", cap, "-m", "sparsemm", "-b", "40", "--window", "8", "--head-scores", bad_json_hs },
          { bad_json_hs, "JSON" } },
        { "h2o without full queries", { "-i", cap, "-m", "h2o", "-b", "40", "--window", "8" },
          { "h2o", "--full-queries" } },
        { "lookm without full queries", { "-i", cap, "-m", "lookm", "-b", "40", "--window", "8" },
          { "lookm+h2o", "--full-queries" } },
        { "window beyond the captured queries", { "-i", cap, "-m", "snapkv", "-b", "64", "--window", "48" },
          { "--window 48", "32" } },
        { "merged output without merge", { "-i", cap, "-m", "snapkv", "--merged-output", fx.out + "/m.safetensors" },
          { "--merged-output", "--merge pivot" } },
        { "missing --output", { "-i", cap, "-m", "snapkv" }, { "missing --output" }, true },
        { "missing --input", { "-m", "snapkv" }, { "missing --input" } },
        { "missing --method", { "-i", cap }, { "missing --method" } },
        { "unknown flag", { "-i", cap, "-m", "snapkv", "--bogus-flag" }, { "bogus-flag" } },
        { "stray argument", { "-i", cap, "-m", "snapkv", "extra" }, { "unexpected argument 'extra'" } },
        { "too many threads", { "-i", cap, "-m", "snapkv", "-t", "100000" }, { "--threads 100000 must lie in [0, 512]" } },
        { "negative threads", { "-i", cap, "-m", "snapkv", "-t", "-3" }, { "--threads -3 must lie in [0, 512]" } },
    };
    const std::string out = fx.out + "/sel.json";
    for (const bad_compress & c : cases) {
        SCOPED_TRACE(c.name);
        std::vector<std::string> args = { "compress", "-t", "2" };
        args.insert(args.end(), c.args.begin(), c.args.end());
        if (!c.no_output) {
            args.push_back("-o");
            args.push_back(out);
        }
        const run_result r = fx.run(args);
        EXPECT_EQ(r.code, 1) << describe(r);
        EXPECT_TRUE(contains(r.err, "ecokv compress: error:")) << describe(r);
        for (const std::string & m : c.messages) {
            EXPECT_TRUE(contains(r.err, m)) << "stderr lacks \"" << m << "\"\n" << describe(r);
        }
        EXPECT_TRUE(r.out.empty()) << describe(r);
        EXPECT_FALSE(fs::exists(out));
        EXPECT_TRUE(list_dir(fx.out).empty()) << "left in out/: " << *list_dir(fx.out).begin();
    }
    // The inputs are untouched by the failures.
    EXPECT_NO_THROW((void) ecokv::capture_file::open(cap));
}

TEST(cli, compress_into_a_missing_directory) {
    cli_fixture       fx;
    const std::string out = fx.out + "/no/such/sel.json";
    const run_result  r   = fx.run({ "compress", "-i", fx.capture, "-m", "snapkv", "-b", "40", "-o", out });
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_TRUE(contains(r.err, out)) << describe(r);
    EXPECT_TRUE(list_dir(fx.out).empty());
}

TEST(cli, failed_compress_keeps_the_previous_output) {
    cli_fixture       fx;
    const std::string out      = fx.out + "/sel.json";
    const std::string previous = "{\"previous\": true}\n";
    write_file(out, previous);
    const std::string nan_capture = write_nan_capture(fx.in + "/nan.safetensors");
    const std::string truncated   = fx.in + "/truncated.safetensors";
    write_file(truncated, read_file(fx.capture).substr(0, 1000));
    const std::string partial_hs = fx.head_scores("partial.json", { "0-2" });

    const std::vector<std::vector<std::string>> failing = {
        { "-i", nan_capture, "-m", "snapkv", "-b", "40", "--window", "8" },
        { "-i", truncated, "-m", "snapkv", "-b", "40", "--window", "8" },
        { "-i", fx.capture, "-m", "bogus" },
        { "-i", fx.capture, "-m", "snapkv", "-b", "8", "--window", "8" },
        { "-i", fx.capture, "-m", "sparsemm", "-b", "40", "--window", "8", "--head-scores", partial_hs },
        { "-i", fx.capture, "-m", "h2o", "-b", "40", "--window", "8" },
    };
    for (const auto & extra : failing) {
        std::vector<std::string> args = { "compress", "-o", out };
        args.insert(args.end(), extra.begin(), extra.end());
        const run_result r = fx.run(args);
        EXPECT_EQ(r.code, 1) << describe(r);
        EXPECT_EQ(read_file(out), previous);
        EXPECT_EQ(list_dir(fx.out), (std::set<std::string>{ "sel.json" }));
    }
    // A failing synth-capture does not clobber an existing capture either.
    const std::string cap_copy = fx.out + "/cap.safetensors";
    fs::copy_file(fx.capture, cap_copy);
    const std::string cap_bytes = read_file(cap_copy);
    const run_result  r = fx.run({ "synth-capture", "--heads", "6", "--kv-heads", "4", "-o", cap_copy });
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_EQ(read_file(cap_copy), cap_bytes);
    // A successful run replaces the output with a valid selection.
    const run_result ok = fx.run({ "compress", "-i", fx.capture, "-m", "snapkv", "-b", "40", "--window", "8", "-o", out });
    ASSERT_EQ(ok.code, 0) << describe(ok);
    check_uniform_selection(json::parse(read_file(out)), "uniform+snapkv", 40, 8);
    EXPECT_EQ(list_dir(fx.out), (std::set<std::string>{ "sel.json", "cap.safetensors" }));
}

TEST(cli, compress_reads_the_golden_capture) {
    // tests/data/golden/tiny-f32.safetensors: 3 layers, 2 KV heads, 56 tokens, full queries.
    temp_dir          dir;
    const std::string out = dir / "sel.json";
    const run_result  r   = run_cli(dir.path().string(),
                                    { "compress", "-i", std::string(ECOKV_TEST_DATA) + "/golden/tiny-f32.safetensors", "-m",
                                      "snapkv", "-b", "20", "--window", "8", "-o", out, "-q" });
    ASSERT_EQ(r.code, 0) << describe(r);
    const json j = json::parse(read_file(out));
    EXPECT_EQ(j["n_tokens"], 56);
    // By hand: 3 * 2 * 56 * (8 * 4 + 8 * 4).
    EXPECT_EQ(j["kv_bytes_full"].get<uint64_t>(), 21504u);
    EXPECT_EQ(j["kv_bytes_kept"].get<uint64_t>(), 3u * 2 * 20 * 64);
    ASSERT_EQ(j["layers"].size(), 3u);
    for (const json & layer : j["layers"]) {
        ASSERT_EQ(layer["heads"].size(), 2u);
        for (const json & h : layer["heads"]) {
            const auto kept = h.get<std::vector<int32_t>>();
            ASSERT_EQ(kept.size(), 20u);
            EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
            EXPECT_EQ(std::vector<int32_t>(kept.end() - 8, kept.end()),
                      (std::vector<int32_t>{ 48, 49, 50, 51, 52, 53, 54, 55 }));
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// report

// An `ecokv eval` results directory written by hand: exact match on items q0..q3 (answer "a<i>"); method m at
// budget b answers the first n[m, b] items right and the others wrong. FullKV answers all 4 right.
std::string write_results(const temp_dir & dir, bool with_mixkv = true) {
    const std::string out = dir / "run";
    fs::create_directories(out);
    write_file(out + "/config.json", json{ { "dataset", "generated" }, { "metric", "exact" } }.dump());
    const std::vector<std::tuple<std::string, int, int>> correct = {
        { "full", 0, 4 },              // 100
        { "uniform+snapkv", 64, 3 },   // 75
        { "uniform+snapkv", 32, 2 },   // 50
        { "uniform+mixkv", 64, 2 },    // 50
        { "uniform+mixkv", 32, 1 },    // 25
        { "pyramidkv+ecokv", 64, 4 },  // 100
        { "pyramidkv+ecokv", 32, 3 },  // 75
    };
    std::string lines;
    for (int i = 0; i < 4; ++i) {
        for (const auto & [method, budget, n] : correct) {
            if (method == "uniform+mixkv" && !with_mixkv) {
                continue;
            }
            const std::string answer = "a" + std::to_string(i);
            const json        line   = { { "id", "q" + std::to_string(i) },
                                         { "method", method },
                                         { "budget", budget },
                                         { "prediction", i < n ? answer : "x" },
                                         { "answers", { answer } } };
            lines += line.dump() + "\n";
        }
    }
    write_file(out + "/results.jsonl", lines);
    return out;
}

// The (method, budget) -> delta pairs of report.json; FullKV has none, nor has the baseline.
std::map<std::pair<std::string, int>, double> deltas(const json & table) {
    std::map<std::pair<std::string, int>, double> out;
    for (const json & s : table["scores"]) {
        if (s.contains("delta")) {
            out[{ s["method"].get<std::string>(), s["budget"].get<int>() }] = s["delta"].get<double>();
        }
    }
    return out;
}

TEST(cli, report_deltas_default_to_mixkv) {
    temp_dir          dir;
    const std::string run = write_results(dir);
    const run_result  r   = run_cli(dir.path().string(), { "report", run });
    ASSERT_EQ(r.code, 0) << describe(r);
    const json table = json::parse(read_file(run + "/report.json"))["generated"];
    EXPECT_EQ(table["baseline"], "uniform+mixkv");
    using key = std::pair<std::string, int>;
    EXPECT_EQ(deltas(table), (std::map<key, double>{ { { "uniform+snapkv", 64 }, 75.0 - 50 },
                                                     { { "uniform+snapkv", 32 }, 50.0 - 25 },
                                                     { { "pyramidkv+ecokv", 64 }, 100.0 - 50 },
                                                     { { "pyramidkv+ecokv", 32 }, 75.0 - 25 } }));
    // Standard errors by hand, over 4 items scored 0 or 100: two right of four, sd = sqrt(4 * 50^2 / 3) = 57.735,
    // se = sd / 2 = 28.9; one or three right: sd = sqrt((75^2 + 3 * 25^2) / 3) = 50, se = 25. The paired difference
    // snapkv - mixkv is 100 on one item and 0 on three at either budget: se 25.
    EXPECT_TRUE(contains(r.out, "| uniform+mixkv | 50.0 ±28.9 | 25.0 ±25.0 |")) << r.out;
    EXPECT_TRUE(contains(r.out, "| uniform+snapkv | 75.0 ±25.0 (+25.0 ±25.0) | 50.0 ±28.9 (+25.0 ±25.0) |")) << r.out;
    EXPECT_TRUE(contains(read_file(run + "/report.csv"),
                         "dataset,metric,method,budget,score,n,se,delta_vs_mixkv,delta_se,n_paired\n"));
}

TEST(cli, report_deltas_against_another_baseline) {
    temp_dir          dir;
    const std::string run = write_results(dir);
    using key             = std::pair<std::string, int>;
    // "snapkv" names uniform+snapkv, as everywhere else.
    for (const char * name : { "snapkv", "uniform+snapkv", "snapkv+snapkv" }) {
        const run_result r = run_cli(dir.path().string(), { "report", run, "--baseline", name });
        ASSERT_EQ(r.code, 0) << describe(r);
        const json table = json::parse(read_file(run + "/report.json"))["generated"];
        EXPECT_EQ(table["baseline"], "uniform+snapkv");
        EXPECT_EQ(deltas(table), (std::map<key, double>{ { { "uniform+mixkv", 64 }, 50.0 - 75 },
                                                         { { "uniform+mixkv", 32 }, 25.0 - 50 },
                                                         { { "pyramidkv+ecokv", 64 }, 100.0 - 75 },
                                                         { { "pyramidkv+ecokv", 32 }, 75.0 - 50 } }))
            << name;
        EXPECT_TRUE(contains(r.out, "| uniform+snapkv | 75.0 ±25.0 | 50.0 ±28.9 |")) << r.out;
        EXPECT_TRUE(contains(r.out, "| uniform+mixkv | 50.0 ±28.9 (-25.0 ±25.0) | 25.0 ±25.0 (-25.0 ±25.0) |")) << r.out;
        EXPECT_TRUE(contains(r.out, "| pyramidkv+ecokv | 100.0 ±0.0 (+25.0 ±25.0) | 75.0 ±25.0 (+25.0 ±25.0) |"))
            << r.out;
        const std::string csv = read_file(run + "/report.csv");
        EXPECT_TRUE(contains(csv, "dataset,metric,method,budget,score,n,se,delta_vs_snapkv,delta_se,n_paired\n")) << csv;
        EXPECT_TRUE(contains(csv, "generated,exact,uniform+mixkv,64,50,4,28.867513,-25.000000,25.000000,4\n")) << csv;
    }
    // FullKV (100 at every budget) as the baseline.
    const run_result r = run_cli(dir.path().string(), { "report", run, "--baseline", "full" });
    ASSERT_EQ(r.code, 0) << describe(r);
    const json table = json::parse(read_file(run + "/report.json"))["generated"];
    EXPECT_EQ(table["baseline"], "FullKV");
    EXPECT_EQ(deltas(table), (std::map<key, double>{ { { "uniform+snapkv", 64 }, -25.0 },
                                                     { { "uniform+snapkv", 32 }, -50.0 },
                                                     { { "uniform+mixkv", 64 }, -50.0 },
                                                     { { "uniform+mixkv", 32 }, -75.0 },
                                                     { { "pyramidkv+ecokv", 64 }, 0.0 },
                                                     { { "pyramidkv+ecokv", 32 }, -25.0 } }));
}

// --tag window: the same results in two directories whose configs differ in the window make two rows per method,
// labelled with their windows; the default baseline resolves to mixkv's first tagged row; FullKV stays one row.
TEST(cli, report_tags_rows_by_config_keys) {
    temp_dir          a, b;
    const std::string run_a = write_results(a), run_b = write_results(b);
    write_file(run_a + "/config.json", json{ { "dataset", "generated" }, { "metric", "exact" }, { "window", 32 } }.dump());
    write_file(run_b + "/config.json", json{ { "dataset", "generated" }, { "metric", "exact" }, { "window", 4 } }.dump());
    const run_result r = run_cli(a.path().string(), { "report", run_a, run_b, "--tag", "window,mixkv_scale" });
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_TRUE(contains(r.out, "| FullKV | 100.0 ±0.0 | 100.0 ±0.0 |")) << r.out;
    EXPECT_TRUE(contains(r.out, "| uniform+mixkv [window 32] | 50.0 ±28.9 | 25.0 ±25.0 |")) << r.out;
    EXPECT_TRUE(contains(r.out, "| uniform+mixkv [window 4] | 50.0 ±28.9 (+0.0 ±0.0) | 25.0 ±25.0 (+0.0 ±0.0) |"))
        << r.out;
    EXPECT_TRUE(contains(r.out, "| uniform+snapkv [window 4] | 75.0 ±25.0 (+25.0 ±25.0) |")) << r.out;
    const run_result r4 =
        run_cli(a.path().string(), { "report", run_a, run_b, "--tag", "window", "--baseline", "snapkv [window 4]" });
    ASSERT_EQ(r4.code, 0) << describe(r4);
    EXPECT_TRUE(contains(r4.out, "| uniform+snapkv [window 32] | 75.0 ±25.0 (+0.0 ±0.0) |")) << r4.out;
}

// --tag cache_type_k: an engine option changes what the full cache computes, so FullKV has a row per cache type, first,
// labelled like the methods' rows; a method option (window) does not split FullKV. The f16 directory records no
// cache_type_k (its default), so its rows stay untagged and "full" is its FullKV.
TEST(cli, report_tags_fullkv_by_engine_options_only) {
    temp_dir          a, b;
    const std::string run_a = write_results(a), run_b = b / "q8";
    fs::create_directories(run_b);
    write_file(run_a + "/config.json", json{ { "dataset", "generated" }, { "metric", "exact" }, { "window", 8 } }.dump());
    write_file(run_b + "/config.json", json{ { "dataset", "generated" }, { "metric", "exact" }, { "window", 8 },
                                             { "cache_type_k", "q8_0" } }.dump());
    std::string lines;
    for (int i = 0; i < 4; ++i) {  // FullKV three of four right, snapkv at 64 one of four
        for (const auto & [method, budget, n] : { std::tuple{ "full", 0, 3 }, std::tuple{ "uniform+snapkv", 64, 1 } }) {
            lines += json{ { "id", "q" + std::to_string(i) }, { "method", method }, { "budget", budget },
                           { "prediction", i < n ? "a" + std::to_string(i) : "x" },
                           { "answers", { "a" + std::to_string(i) } } }.dump() + "\n";
        }
    }
    write_file(run_b + "/results.jsonl", lines);
    const run_result r =
        run_cli(a.path().string(), { "report", run_a, run_b, "--tag", "window,cache_type_k", "--baseline", "full" });
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_TRUE(contains(r.out, "| method | 64 | 32 |\n|---|---:|---:|\n| FullKV | 100.0 ±0.0 | 100.0 ±0.0 |\n"
                                "| FullKV [cache_type_k q8_0] | 75.0 ±25.0 | 75.0 ±25.0 |\n")) << r.out;
    // against the f16 FullKV: 25 - 100 on the paired items
    EXPECT_TRUE(contains(r.out, "| uniform+snapkv [window 8, cache_type_k q8_0] | 25.0 ±25.0 (-75.0 ±25.0) | - |"))
        << r.out;
    EXPECT_TRUE(contains(r.out, "| uniform+snapkv [window 8] | 75.0 ±25.0 (-25.0 ±25.0) |")) << r.out;
}

// The full cache of images resized to at most N tokens (eval --image-max-tokens N) is the smaller-image baseline: one
// row, in budget N's column, with its paired difference to the baseline there.
TEST(cli, report_places_the_smaller_image_in_its_budget_column) {
    temp_dir          a, b;
    const std::string run = write_results(a), small = b / "small";
    fs::create_directories(small);
    write_file(small + "/config.json",
               json{ { "dataset", "generated" }, { "metric", "exact" }, { "image_max_tokens", 32 } }.dump());
    std::string lines;
    for (int i = 0; i < 4; ++i) {  // one of four right
        lines += json{ { "id", "q" + std::to_string(i) }, { "method", "full" }, { "budget", 0 },
                       { "prediction", i < 1 ? "a0" : "x" }, { "answers", { "a" + std::to_string(i) } } }.dump() + "\n";
    }
    write_file(small + "/results.jsonl", lines);
    const run_result r = run_cli(a.path().string(), { "report", run, small });
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_TRUE(contains(r.out, "| FullKV | 100.0 ±0.0 | 100.0 ±0.0 |")) << r.out;
    // mixkv at 32 answers q0 only too: the paired difference is 0 on every item
    EXPECT_TRUE(contains(r.out, "| FullKV, smaller image | - | 25.0 ±25.0 (+0.0 ±0.0) |")) << r.out;
}

// A run of the full cache alone (eval --methods full, whatever its --budgets) is a table of one score column.
TEST(cli, report_of_the_full_cache_alone_has_its_score) {
    temp_dir          dir;
    const std::string run = dir / "full";
    fs::create_directories(run);
    write_file(run + "/config.json", json{ { "dataset", "generated" }, { "metric", "exact" } }.dump());
    std::string lines;
    for (int i = 0; i < 4; ++i) {  // three of four right
        lines += json{ { "id", "q" + std::to_string(i) }, { "method", "full" }, { "budget", 0 },
                       { "prediction", i < 3 ? "a" + std::to_string(i) : "x" },
                       { "answers", { "a" + std::to_string(i) } } }.dump() + "\n";
    }
    write_file(run + "/results.jsonl", lines);
    const run_result r = run_cli(dir.path().string(), { "report", run });
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_TRUE(contains(r.out, "| method | score |\n|---|---:|\n| FullKV | 75.0 ±25.0 |")) << r.out;
    const json table = json::parse(read_file(run + "/report.json"))["generated"];
    ASSERT_EQ(table["scores"].size(), 1u) << table.dump();
    EXPECT_EQ(table["scores"][0]["score"].get<double>(), 75.0);
    EXPECT_TRUE(contains(read_file(run + "/report.csv"), "generated,exact,FullKV,0,75,4,"));
}

// Without uniform+mixkv in the results the default baseline gives no deltas; a baseline named on the command line
// must be in the results, and must be a method.
TEST(cli, report_baseline_absent_or_unknown) {
    temp_dir          dir;
    const std::string run = write_results(dir);
    run_result        r   = run_cli(dir.path().string(), { "report", run, "--baseline", "pyramidkv" });
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_TRUE(contains(r.err, "ecokv report: error: --baseline pyramidkv+snapkv: no results for it in the "
                                "directories given; methods there: full, uniform+snapkv, uniform+mixkv, "
                                "pyramidkv+ecokv"))
        << describe(r);
    r = run_cli(dir.path().string(), { "report", run, "--baseline", "mixk" });
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_TRUE(contains(r.err, "ecokv report: error: --baseline: unknown method 'mixk'; known: ")) << describe(r);

    temp_dir          other;
    const std::string no_mixkv = write_results(other, false);
    r                          = run_cli(other.path().string(), { "report", no_mixkv });
    ASSERT_EQ(r.code, 0) << describe(r);
    EXPECT_TRUE(deltas(json::parse(read_file(no_mixkv + "/report.json"))["generated"]).empty());
    EXPECT_TRUE(contains(r.out, "| uniform+snapkv | 75.0 ±25.0 | 50.0 ±28.9 |")) << r.out;
    r = run_cli(other.path().string(), { "report", no_mixkv, "--baseline", "mixkv" });
    EXPECT_EQ(r.code, 1) << describe(r);
    EXPECT_TRUE(contains(r.err, "--baseline uniform+mixkv: no results for it")) << describe(r);
}

}  // namespace
