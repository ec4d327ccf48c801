// `ecokv run` with images through libmtmd, on random-weight vision-language models written to disk: a tiny
// qwen2vl text model with a qwen2vl_merger projector (M-RoPE) and a tiny llama with a LLaVA mlp projector. A
// budget covering the prompt reproduces the full cache; small budgets compress image and text tokens; bad
// inputs are rejected with a clear message.
#include "test-util.h"
#include "tiny-mmproj.h"
#include "tiny-model.h"

#include <llama.h>

#include <gtest/gtest.h>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>
#include <nlohmann/json.hpp>

namespace {

using namespace ecokv::test;
using json = nlohmann::json;

// A model/projector pair on disk plus a test image (PPM, read by mtmd's stb_image).
struct vision_fixture {
    temp_dir    dir;
    std::string model, mmproj, image;

    vision_fixture(const std::string & arch, mmproj_type type) { use(write_tiny_vlm(dir.path().string(), arch, type)); }
    explicit vision_fixture(const vlm_family & family) { use(write_tiny_vlm(dir.path().string(), family)); }

    void use(const tiny_vlm_files & f) {
        model  = f.model;
        mmproj = f.mmproj;
        image  = dir / "image.ppm";
        write_test_ppm(image, 112, 84, 5);
    }

    run_result run(std::vector<std::string> args) const {
        args.insert(args.begin(), { "run", "--model", model, "--mmproj", mmproj, "--image", image, "-t", "2" });
        return run_cli(dir.path().string(), args);
    }
    json run_json(std::vector<std::string> args) const {
        args.push_back("--json");
        const run_result r = run(args);
        EXPECT_EQ(r.code, 0) << describe(r);
        return r.code == 0 ? json::parse(r.out) : json::object();
    }
};

void check_vision_run(const vision_fixture & f, int32_t image_tokens) {
    const std::string prompt = std::string("describe ") + "<__media__>" + " in words, then say more";
    const json full = f.run_json({ "-p", prompt, "-m", "snapkv+ecokv", "-b", "1024", "-n", "8", "--compare-full" });
    ASSERT_TRUE(full.contains("image_tokens"));
    EXPECT_EQ(full["image_tokens"].get<int>(), image_tokens);
    EXPECT_EQ(full["answers"][0]["text"], full["answers"][0]["full_text"]);
    EXPECT_EQ(full["agreement"].get<double>(), 1.0);
    EXPECT_LT(full["mean_kl"].get<double>(), 1e-6);

    for (const char * method : { "snapkv+ecokv", "pyramidkv+ecokv", "madakv" }) {
        const json small = f.run_json({ "-p", prompt, "-m", method, "-b", "12", "--window", "2", "-n", "8", "--compare-full" });
        ASSERT_TRUE(small.contains("cells_per_head")) << method;
        EXPECT_LT(small["cells_per_head"].get<int>(), full["prompt_tokens"].get<int>()) << method;
        EXPECT_LT(small["kv_bytes_kept"].get<uint64_t>(), full["kv_bytes_kept"].get<uint64_t>()) << method;
        EXPECT_GE(small["mean_kl"].get<double>(), 0.0) << method;
    }
    // Chunked (4 cells: the text before the image joins it, an image is never split, the text after is its own
    // chunk): a covering budget answers as the full cache, with the image's positions (M-RoPE) kept; a small one
    // compresses after every chunk.
    const json chunked = f.run_json({ "-p", prompt + " and more words to make a chunk", "-m", "snapkv+ecokv", "-b",
                                      "1024", "--window", "2", "-n", "8", "--chunk", "4", "--compare-full" });
    EXPECT_EQ(chunked["answers"][0]["text"], chunked["answers"][0]["full_text"]);
    EXPECT_LT(chunked["mean_kl"].get<double>(), 1e-6);
    const json chunked_small = f.run_json({ "-p", prompt + " and more words to make a chunk", "-m", "adakv+ecokv", "-b",
                                            "8", "--window", "2", "-n", "8", "--chunk", "4", "--compare-full" });
    EXPECT_LE(chunked_small["cells_per_head"].get<int>(), 8 + 6);
    EXPECT_GE(chunked_small["mean_kl"].get<double>(), 0.0);
    // Question-agnostic: the image is compressed before any question is seen.
    const json q = f.run_json({ "-p", "<__media__> a picture", "--question", "what is it", "--question", "which colour",
                                "-m", "snapkv+ecokv", "-b", "10", "--window", "2", "-n", "6" });
    EXPECT_EQ(q["answers"].size(), 2u);
}

TEST(run_vision, qwen2vl_merger) {
    const vision_fixture f("qwen2vl", mmproj_type::qwen2vl_merger);
    check_vision_run(f, 12);  // 112x84 px in 28 px merged patches: 4 x 3
}

TEST(run_vision, llava_mlp) {
    const vision_fixture f("llama", mmproj_type::llava_mlp);
    check_vision_run(f, 16);  // resized to 56x56, 14 px patches: 4 x 4
}

// ecokv analyze on a model: each image's token grid as mtmd lays it out (computed independently by
// expected_image_geometry), at the default size and under --image-max-tokens, and one kept share per layer and token.
void check_analyze_grid(const vision_fixture & f, const char * arch, const std::vector<std::string> & extra,
                        const image_geometry & g) {
    std::vector<std::string> args = { "analyze", "--model", f.model, "--mmproj", f.mmproj, "--image", f.image, "-p",
                                      "<__media__> a picture of some words", "-m", "snapkv", "-b", "8", "--window", "2",
                                      "--out", f.dir / "an", "--no-plots", "-t", "2" };
    args.insert(args.end(), extra.begin(), extra.end());
    const run_result r = run_cli(f.dir.path().string(), args);
    ASSERT_EQ(r.code, 0) << describe(r);
    const json a = json::parse(read_file(std::string(f.dir / "an") + "/analysis.json"));
    ASSERT_EQ(a["images"].size(), 1u) << arch;
    const json & im = a["images"][0];
    EXPECT_EQ(im["cols"].get<int>(), g.tokens_x == g.n_tokens ? 4 : g.tokens_x) << arch;  // llava: a square grid
    EXPECT_EQ(im["rows"].get<int>() * im["cols"].get<int>(), g.n_tokens) << arch;
    EXPECT_GE(im["first_cell"].get<int>(), 0) << arch;
    EXPECT_LE(im["first_cell"].get<int>() + g.n_tokens, a["n_tokens"].get<int>()) << arch;
    EXPECT_TRUE(im["path"].get<std::string>().ends_with("image.ppm")) << arch;
    ASSERT_EQ(a["kept_share_by_layer"].size(), a["layers"].size());
    for (const json & layer : a["kept_share_by_layer"]) {
        EXPECT_EQ(layer.size(), a["n_tokens"].get<size_t>());
    }
}

TEST(run_vision, analyze_maps_image_tokens_to_their_grid) {
    const tiny_mmproj_config qc;
    const vision_fixture     q("qwen2vl", mmproj_type::qwen2vl_merger);
    check_analyze_grid(q, "qwen2vl", {}, expected_image_geometry(qc, 112, 84));
    check_analyze_grid(q, "qwen2vl", { "--image-max-tokens", "9" }, expected_image_geometry(qc, 112, 84, -1, 9));
    const json small = q.run_json({ "-p", "<__media__> x", "--image-max-tokens", "9", "-n", "1" });
    EXPECT_EQ(small["image_tokens"].get<int>(), expected_image_geometry(qc, 112, 84, -1, 9).n_tokens);
    // With plots: the kept-token map over the image (or a note that python3 lacks matplotlib).
    const run_result plotted = run_cli(q.dir.path().string(), { "analyze", "--model", q.model, "--mmproj", q.mmproj,
                                                                "--image", q.image, "-b", "6", "--window", "2", "--out",
                                                                q.dir / "plots", "-t", "2" });
    ASSERT_EQ(plotted.code, 0) << describe(plotted);
    if (!contains(plotted.out, "plots skipped")) {
        EXPECT_EQ(read_file(std::string(q.dir / "plots") + "/kept-map-0.png").substr(0, 4), "\x89PNG") << describe(plotted);
    }

    tiny_mmproj_config lc;
    lc.type = mmproj_type::llava_mlp;
    const vision_fixture l("llama", mmproj_type::llava_mlp);
    check_analyze_grid(l, "llava", {}, expected_image_geometry(lc, 112, 84));
}

// Every family through the CLI: run (a covering budget is the full cache; a small one compresses image and text with
// per-head budgets) and analyze (one entry per image chunk: tiles then the overview, all of image 0).
TEST(run_vision, every_family_runs_and_analyzes) {
    for (const vlm_family & family : vlm_families()) {
        SCOPED_TRACE(family.name);
        const vision_fixture f(family);
        const std::string    prompt = "describe <__media__> in words, then say more";
        const json full = f.run_json({ "-p", prompt, "-m", "snapkv+ecokv", "-b", "1024", "-n", "6", "--compare-full" });
        EXPECT_EQ(full["agreement"].get<double>(), 1.0);
        EXPECT_LT(full["mean_kl"].get<double>(), 1e-6);
        const json small = f.run_json({ "-p", prompt, "-m", "adakv+ecokv", "-b", "10", "--window", "2", "-n", "6",
                                        "--compare-full" });
        EXPECT_LT(small["kv_bytes_kept"].get<uint64_t>(), full["kv_bytes_kept"].get<uint64_t>());
        // chunked prefill (24 cells: tiles and text chunks as units) with a covering budget is the full cache
        const json chunked = f.run_json({ "-p", prompt, "-m", "snapkv+ecokv", "-b", "1024", "--window", "2", "-n", "6",
                                          "--chunk", "24", "--compare-full" });
        EXPECT_EQ(chunked["agreement"].get<double>(), 1.0);
        EXPECT_LT(chunked["mean_kl"].get<double>(), 1e-6);
        // question mode: the family's chat template split where the questions go, the context compressed first
        const json asked = f.run_json({ "-p", "<__media__> a picture", "--question", "what is it", "--question",
                                        "which colour", "-m", "snapkv+ecokv", "-b", "10", "--window", "2", "-n", "4" });
        EXPECT_EQ(asked["answers"].size(), 2u);
        const run_result r = run_cli(f.dir.path().string(), { "analyze", "--model", f.model, "--mmproj", f.mmproj,
                                                              "--image", f.image, "-p", prompt, "-b", "8", "--window",
                                                              "2", "--out", f.dir / "an", "--no-plots", "-t", "2" });
        ASSERT_EQ(r.code, 0) << describe(r);
        const json a = json::parse(read_file(std::string(f.dir / "an") + "/analysis.json"));
        ASSERT_GE(a["images"].size(), 1u);
        int32_t n_image = 0;
        for (const json & im : a["images"]) {
            EXPECT_EQ(im["image"].get<int>(), 0);
            EXPECT_EQ(im["n_parts"].get<size_t>(), a["images"].size());
            n_image += im["rows"].get<int>() * im["cols"].get<int>();
        }
        EXPECT_EQ(n_image, full["image_tokens"].get<int>());
    }
}

std::vector<std::string> split_lines(const std::string & text) {
    std::vector<std::string> lines;
    std::istringstream       in(text);
    for (std::string line; std::getline(in, line);) {
        if (!line.empty()) {
            lines.push_back(line);
        }
    }
    return lines;
}

// Base64 (RFC 4648) of a file, for a data URL.
std::string base64_of(const std::string & path) {
    static const char * k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const std::string   b = read_file(path);
    std::string         out;
    for (size_t i = 0; i < b.size(); i += 3) {
        const uint32_t n = uint32_t(uint8_t(b[i])) << 16 | (i + 1 < b.size() ? uint32_t(uint8_t(b[i + 1])) << 8 : 0) |
                           (i + 2 < b.size() ? uint32_t(uint8_t(b[i + 2])) : 0);
        out += k[n >> 18 & 63];
        out += k[n >> 12 & 63];
        out += i + 1 < b.size() ? k[n >> 6 & 63] : '=';
        out += i + 2 < b.size() ? k[n & 63] : '=';
    }
    return out;
}

// Every family through ecokv eval (two items, the full cache and a compression) and ecokv serve (a chat with the
// image, compressed, answered with the kv entries it holds), with curl as the client.
TEST(run_vision, every_family_evaluates_and_serves) {
    for (const vlm_family & family : vlm_families()) {
        SCOPED_TRACE(family.name);
        const vision_fixture f(family);
        const std::string    data = f.dir / "data";
        std::filesystem::create_directories(data);
        std::string items;
        for (int i = 0; i < 2; ++i) {
            write_test_ppm(data + "/img" + std::to_string(i) + ".ppm", 112, 84, uint64_t(i + 1));
            items += json{ { "id", "q" + std::to_string(i) }, { "image", { "img" + std::to_string(i) + ".ppm" } },
                           { "question", "what is written?" }, { "answers", { "a" } }, { "type", "t" } }
                         .dump() + "\n";
        }
        write_file(data + "/items.jsonl", items);
        const run_result e = run_cli(f.dir.path().string(),
                                     { "eval", "--model", f.model, "--mmproj", f.mmproj, "--dataset", "generated", "--data",
                                       data, "--methods", "full,adakv+ecokv", "--budgets", "8", "--window", "2", "-n", "3",
                                       "-t", "2", "--out", f.dir / "ev" });
        ASSERT_EQ(e.code, 0) << describe(e);
        int n_records = 0;
        for (const std::string & line : split_lines(read_file(std::string(f.dir / "ev") + "/results.jsonl"))) {
            const json r = json::parse(line);
            EXPECT_FALSE(r.contains("error")) << line;
            ++n_records;
        }
        EXPECT_EQ(n_records, 4);

        const std::string port = f.dir / "port", pid = f.dir / "pid", log = f.dir / "serve.log";
        const std::string start = quote(ECOKV_CLI) + " serve --port 0 --port-file " + quote(port) + " --model " +
                                  quote(f.model) + " --mmproj " + quote(f.mmproj) + " -t 2 --max-tokens 4 2>" +
                                  quote(log) + " </dev/null & echo $! > " + quote(pid);
        ASSERT_EQ(std::system(start.c_str()), 0);
        for (int i = 0; i < 300 && read_file(port).empty(); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        ASSERT_FALSE(read_file(port).empty()) << read_file(log);
        const json body = { { "messages",
                              { { { "role", "user" },
                                  { "content",
                                    { { { "type", "image_url" },
                                        { "image_url", { { "url", "data:image/x-portable-pixmap;base64," +
                                                                      base64_of(f.image) } } } },
                                      { { "type", "text" }, { "text", "what is written?" } } } } } } },
                            { "kv_compression", { { "method", "snapkv+ecokv" }, { "budget", 8 }, { "window", 2 } } } };
        write_file(f.dir / "body.json", body.dump());
        const std::string url  = "http://127.0.0.1:" + split_lines(read_file(port)).at(0) + "/v1/chat/completions";
        const std::string curl = "curl -s -o " + quote(f.dir / "reply.json") + " -w '%{http_code}' -H " +
                                 quote("Content-Type: application/json") + " --data-binary @" +
                                 quote(f.dir / "body.json") + " " + quote(url) + " > " + quote(f.dir / "status");
        const int rc = std::system(curl.c_str());
        std::system(("kill $(cat " + quote(pid) + ") 2>/dev/null").c_str());
        ASSERT_EQ(rc, 0);
        ASSERT_EQ(read_file(f.dir / "status"), "200") << read_file(f.dir / "reply.json") << read_file(log);
        const json reply = json::parse(read_file(f.dir / "reply.json"));
        EXPECT_GT(reply["usage"]["prompt_tokens"].get<int>(), 8);
        EXPECT_LT(reply["usage"]["kv_bytes_kept"].get<uint64_t>(), reply["usage"]["kv_bytes_full"].get<uint64_t>());
    }
}

TEST(run_vision, bad_inputs) {
    const vision_fixture f("qwen2vl", mmproj_type::qwen2vl_merger);
    tiny_mmproj_config wrong;
    wrong.n_embd_text = 48;  // the text model has 64
    write_tiny_mmproj(f.dir / "wrong.gguf", wrong);
    write_file(f.dir / "broken.png", "not an image");
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        { { "run", "--model", f.model, "--mmproj", f.dir / "wrong.gguf", "--image", f.image, "-p", "x", "-m", "ecokv" },
          "the projector's output width is 48, the model's embedding width 64" },
        { { "run", "--model", f.model, "--mmproj", f.dir / "none.gguf", "--image", f.image, "-p", "x", "-m", "ecokv" },
          "no such mmproj file" },
        { { "run", "--model", f.model, "--mmproj", f.mmproj, "--image", f.dir / "broken.png", "-p", "x", "-m", "ecokv" },
          "broken.png: cannot decode the image" },
        { { "run", "--model", f.model, "--mmproj", f.mmproj, "--image", f.dir / "missing.png", "-p", "x", "-m", "ecokv" },
          "missing.png: cannot read the image" },
        { { "run", "--model", f.model, "--image", f.image, "-p", "x", "-m", "ecokv" }, "--image needs --mmproj" },
    };
    for (const auto & [args, message] : cases) {
        const run_result r = run_cli(f.dir.path().string(), args);
        EXPECT_EQ(r.code, 1) << describe(r);
        EXPECT_TRUE(contains(r.err, message)) << "expected '" << message << "'\n" << describe(r);
    }
}

}  // namespace
