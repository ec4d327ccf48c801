// bench-decode: end-to-end cost of KV-cache compression inside llama.cpp at a realistic model shape.
//
// Builds a random-weight model with Qwen2-VL-2B's text geometry in memory (the tests' builder, tiny-model.h, with
// Q8_0 matrices and no F32 copy), prefills N random token ids through an ecokv::llama::session, then for the full
// cache and for every (method, budget) measures KV memory (allocated and kept), RSS per phase, prefill time,
// compression time (select + rebuild), decode time and tokens/s over --n-decode tokens, and the decode tokens/s of an
// *uncompressed* sequence holding as many cells as the compressed one keeps per head (a fresh prefill of that many
// tokens). Last, the first method compresses the prefilled sequence in place, measuring the pipeline's peak.
// Prints a table in the spirit of Table 5 of the ECOKV paper, and checks four targets:
//   decode tok/s(compressed) >= 0.97 x tok/s(uncompressed, same cells);
//   compression time < 2% of the prefill time;
//   KV bytes allocated <= 1.05 x (kept entries + room for n_decode tokens) + 32 cells per layer;
//   peak RSS of prefill + compression in place <= peak RSS of the prefill + the compressed cache + 5%.
// See bench/bench-decode.md. Usage: bench-decode --help
#include "bench-common.h"
#include "seeded-random.h"

#include "ecokv/error.h"
#include "ecokv/safetensors.h"
#include "ecokv/llama-batch.h"
#include "ecokv/llama-options.h"
#include "ecokv/llama-session.h"

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace el = ecokv::llama;
using namespace ecokv::bench;
using json = nlohmann::json;

std::string fmt(const char * f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

// ---- options ---------------------------------------------------------------------------------------------------

// An engine option's value as its flag spells it ("q8_0").
std::string engine_text(const model_shape & m, const char * key) {
    return ecokv::option_text(ecokv::llama::get_engine_option(m.engine, key));
}

struct options : model_shape, output_options {
    int32_t                  n_tokens = 8192, n_decode = 64, repeats = 5, batch = 0;
    std::vector<int32_t>     budgets;
    std::vector<std::string> methods;
    ecokv::compression       base;  // the other compression options (the table's); head_scores: a synthetic file when
                                    // sparsemm runs without one
    bool                     synthetic_head_scores = false;  // written by this run, removed at its end
};

cxxopts::Options option_spec() {
    cxxopts::Options spec("bench-decode", "Prefill, compression and decode cost inside llama.cpp on a random-weight "
                                          "model at Qwen2-VL-2B's shape (vocabulary reduced).");
    const auto       i32 = [](const char * d) { return cxxopts::value<int32_t>()->default_value(d); };
    // clang-format off
    spec.add_options()
        ("tokens", "prompt length (random token ids)", i32("8192"), "N")
        ("n-decode", "tokens decoded per measurement", i32("64"), "N")
        ("budgets", "comma-separated budgets (tokens kept per KV head)", cxxopts::value<std::string>()->default_value("64,256"), "LIST")
        ("methods", "comma-separated methods, e.g. snapkv+ecokv,pyramidkv+ecokv", cxxopts::value<std::string>()->default_value("snapkv+ecokv"), "LIST")
        ("repeats", "decode runs per configuration (best and median)", i32("5"), "N")
        ("batch", "also decode N copies of each compressed sequence together in one context (ecokv::llama::batch, "
                  "one llama_decode a step); 0: not", i32("0"), "N");
    // clang-format on
    // The other method options of the table (--seed is the bench's: weights and prompt); --head-scores defaults to
    // seeded random scores (fine for memory and speed).
    ecokv::tools::add_compression_options(spec, ecokv::scope_method, {}, { "method", "budget", "seed" });
    return spec;
}

// Parses the command line; nullopt after printing --help.
std::optional<options> parse_options(int argc, char ** argv) {
    cxxopts::Options                          spec   = option_spec();
    const std::optional<cxxopts::ParseResult> parsed = parse_bench_options(spec, argc, argv);
    if (!parsed) {
        return std::nullopt;
    }
    const cxxopts::ParseResult & args = *parsed;
    options                      o;
    static_cast<model_shape &>(o)    = read_model_options(args);
    static_cast<output_options &>(o) = read_output_options(args);
    o.n_tokens   = bounded(args, "tokens", 1);
    o.n_decode   = bounded(args, "n-decode", 1);
    o.repeats    = bounded(args, "repeats", 1);
    o.batch      = bounded(args, "batch", 0);
    for (const std::string & b : ecokv::tools::split_list(args["budgets"].as<std::string>())) {
        ecokv::compression c;
        ecokv::set_option(c, "budget", b);
        o.budgets.push_back(c.params.budget);
    }
    o.methods    = ecokv::tools::split_list(args["methods"].as<std::string>());
    o.base       = ecokv::tools::compression_from(args);
    if (o.budgets.empty() || o.methods.empty()) {
        throw ecokv::error("--budgets and --methods need at least one entry");
    }
    if (o.n_tokens + o.n_decode > k_n_ctx_train) {
        throw ecokv::error("--tokens + --n-decode must fit the model's 32768-token context");
    }
    return o;
}

// The methods, checked at every budget before the model is built, and what their capture needs (the union).
struct method_plan {
    std::vector<ecokv::method_spec> specs;
    ecokv::method_requirements      needs;
};

// Seeded random SparseMM head scores in the official JSON layout ({"layer-head": [score, ...]}): the scores of a
// random model mean nothing, but they give sparsemm its uneven head budgets. Written to a temporary file.
std::string synthetic_head_scores(const options & o) {
    const auto path = std::filesystem::temp_directory_path() /
                      ("bench-decode-head-scores-" + std::to_string(::getpid()) + ".json");
    ecokv::test::splitmix64 rng{ o.seed + 99 };
    json                    scores = json::object();
    for (int32_t l = 0; l < o.n_layer; ++l) {
        for (int32_t h = 0; h < o.n_head; ++h) {
            scores[std::to_string(l) + "-" + std::to_string(h)] = { double(rng.next() % 1000) / 1000.0, 0.0 };
        }
    }
    ecokv::write_file_atomic(path.string(), scores.dump());
    return path.string();
}

// A method's parameters at a budget.
ecokv::method_params params_at(const options & o, int32_t budget) {
    ecokv::method_params p = o.base.params;
    p.budget               = budget;
    return p;
}

method_plan plan_methods(options & o) {
    method_plan plan;
    for (const auto & m : o.methods) {
        plan.specs.push_back(ecokv::parse_method(m));
        if (o.base.params.head_scores.empty() && ecokv::requirements(plan.specs.back(), {}).head_scores) {
            o.base.params.head_scores           = synthetic_head_scores(o);
            o.synthetic_head_scores = true;
        }
        for (int32_t b : o.budgets) {
            const ecokv::method_params p = params_at(o, b);
            p.validate(ecokv::method_window(plan.specs.back(), p));
            plan.needs |= ecokv::requirements(plan.specs.back(), p);
        }
    }
    return plan;
}

// ---- statistics ------------------------------------------------------------------------------------------------

double sum(const std::vector<double> & v) {
    double s = 0;
    for (double x : v) {
        s += x;
    }
    return s;
}

double min_of(const std::vector<double> & v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

double median(std::vector<double> v) {
    if (v.empty()) {
        return 0;
    }
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}


// ---- decoding --------------------------------------------------------------------------------------------------

struct decode_run {
    std::vector<double> steps;      // seconds of each step: one-token decode + argmax
    double              cpu_share = 0;  // CPU seconds / (wall seconds x threads)
};

// One warm-up token, then back to the sequence's origin (prompt, compression or snapshot) and n greedy single-token
// decodes, each timed; `seq` is rewound again for the next run.
decode_run timed_decode(el::sequence & seq, int32_t n, int32_t threads) {
    seq.decode({ el::argmax(seq.logits()) });
    seq.rewind();
    decode_run  run;
    llama_token tok  = el::argmax(seq.logits());
    const double cpu0 = cpu_seconds();
    const auto   w0   = clock_type::now();
    for (int32_t i = 0; i < n; ++i) {
        const auto t0 = clock_type::now();
        seq.decode({ tok });
        tok = el::argmax(seq.logits());
        run.steps.push_back(seconds_since(t0));
    }
    run.cpu_share = (cpu_seconds() - cpu0) / (seconds_since(w0) * double(threads));
    seq.rewind();
    return run;
}

// ---- the pipeline ----------------------------------------------------------------------------------------------

struct full_result {
    double              prefill_s = 0, prefill_cpu_share = 0;
    phase               prefill, read, decode;
    uint64_t            bytes_per_cell = 0, kv_alloc = 0, kv_kept = 0, n_ctx = 0;
    std::vector<double> decode_s, cpu_share;  // per run
};

struct in_place_result {
    uint64_t prefill_peak_kib = 0, peak_kib = 0, rss_kib = 0, kv_alloc = 0;
};

struct config_result {
    std::string  method;  // canonical
    int32_t      budget = 0, window = 0, n_cells = 0, kept_cells = 0;  // longest head; mean kept per head
    bool         uniform = true;
    uint64_t     kv_alloc = 0, kv_kept = 0;
    double       select_s = 0, rebuild_s = 0, capture_s = 0;
    uint64_t     compress_peak_kib = 0;
    uint64_t     bytes_to_host = 0;       // device -> host for the compression
    int64_t      device_context_bytes = -1;  // device memory the compressed context took (-1: no device)
    el::snapshot snap;                                    // the compressed sequence, resumed for each decode run
    std::vector<double> decode_s, base_decode_s;          // per run
    std::vector<double> decode_steps, base_decode_steps;  // per token, all runs
    std::vector<double> cpu_share, base_cpu_share;        // per run
    double              base_prefill_s = 0;
    uint64_t            decode_peak_kib = 0, base_peak_kib = 0;
    std::vector<double> batch_steps;  // --batch: seconds of each step decoding every copy's next token
};

// The prompt, with the capture every method needs, into a sequence with room for n_decode more tokens.
el::sequence prefill(const el::session & s, const options & o, const ecokv::method_requirements & needs,
                     phase_meter & pm, full_result & full) {
    progress("[2/7] prefill of %d random tokens (%d threads, ubatch %d)\n", o.n_tokens, o.threads, o.n_ubatch);
    const el::prompt p = s.make_prompt(random_tokens(o.n_tokens, o.n_vocab, o.seed));
    pm.begin("prefill (context + decode of the prompt)");
    const double cpu0 = cpu_seconds();
    const auto   w0   = clock_type::now();
    el::sequence seq  = s.prefill(p, o.n_decode, needs);
    full.prefill_cpu_share = (cpu_seconds() - cpu0) / (seconds_since(w0) * o.threads);
    full.prefill           = pm.end();
    full.prefill_s         = seq.prefill_seconds();
    progress("  prefill %.1f s (%.1f tok/s, CPU share %.2f), RSS %.0f MiB, peak %.0f MiB\n", full.prefill_s,
             o.n_tokens / full.prefill_s, full.prefill_cpu_share, kib_to_mib(full.prefill.rss_kib),
             kib_to_mib(full.prefill.peak_kib));
    return seq;
}

// The capture (views of the cache in place) and the full cache's sizes.
void read_state(const el::sequence & seq, phase_meter & pm, full_result & full) {
    progress("[3/7] viewing the prefill cache as a capture\n");
    pm.begin("capture (views of the prefill cache)");
    seq.capture();
    full.read           = pm.end();
    full.bytes_per_cell = seq.kv_bytes_per_cell();
    full.kv_alloc       = seq.kv_bytes_allocated();
    full.kv_kept        = seq.kv_bytes_kept();
    full.n_ctx          = full.kv_alloc / full.bytes_per_cell;
}

// One (method, budget); the compressed sequence is kept only as its snapshot, so a single decode context is alive
// at a time.
config_result compress_one(const el::sequence & seq, const ecokv::method_spec & spec, const std::string & label,
                           int32_t budget, const options & o, phase_meter & pm) {
    const ecokv::method_params p = params_at(o, budget);
    pm.begin("compress " + label + " B=" + std::to_string(budget));
    const int64_t      device_before = device_used_bytes();
    const el::sequence cs = seq.compress(spec, p, o.n_decode);
    const phase        ph = pm.end();
    const auto &       ci = cs.compression();
    config_result      c;
    c.budget            = budget;
    c.method            = ci.sel.method;
    c.window            = ci.sel.window;
    c.n_cells           = cs.n_cells();
    c.kv_alloc          = cs.kv_bytes_allocated();
    c.kv_kept           = cs.kv_bytes_kept();
    c.snap              = cs.save();
    // mean kept entries per head of the compressed layers (an iSWA model's global ones), rounded up
    const uint64_t kept_rows = std::accumulate(c.snap.layout.begin(), c.snap.layout.end(), uint64_t(0));
    c.kept_cells        = int32_t((kept_rows + c.snap.layout.size() - 1) / c.snap.layout.size());
    c.select_s          = ci.select_seconds;
    c.rebuild_s         = ci.rebuild_seconds;
    c.capture_s         = ci.capture_seconds;
    c.bytes_to_host     = ci.bytes_to_host;
    c.device_context_bytes = device_before < 0 ? -1 : device_used_bytes() - device_before;
    c.compress_peak_kib = ph.peak_kib;
    c.uniform = std::all_of(c.snap.layout.begin(), c.snap.layout.end(), [&](uint32_t n) { return n == c.snap.layout[0]; });
    progress("  %-18s B=%-4d select %.3f s, rebuild %.3f s, longest head %d, KV %.2f MiB allocated, %.2f MiB kept\n",
             c.method.c_str(), budget, c.select_s, c.rebuild_s, c.n_cells, mib(c.kv_alloc), mib(c.kv_kept));
    return c;
}

std::vector<config_result> compress_all(el::sequence & seq, const options & o, const method_plan & plan,
                                        phase_meter & pm) {
    progress("[4/7] compressing into new sequences: %zu method(s) x %zu budget(s)\n", plan.specs.size(),
             o.budgets.size());
    std::vector<config_result> results;
    for (size_t mi = 0; mi < plan.specs.size(); ++mi) {
        for (int32_t budget : o.budgets) {
            results.push_back(compress_one(seq, plan.specs[mi], o.methods[mi], budget, o, pm));
        }
    }
    return results;
}

// The pipeline `ecokv run` has: a new prefill, then the first method at the first budget in the prefilled sequence's
// own context, which frees the full cache as the kept entries are written. Run last, when nothing else is held, so
// that both peaks are the pipeline's own.
in_place_result compress_in_place(const el::session & s, const options & o, const method_plan & plan,
                                  phase_meter & pm) {
    progress("[7/7] prefill again, then compress in place: %s B=%d\n", o.methods[0].c_str(), o.budgets[0]);
    const el::prompt p = s.make_prompt(random_tokens(o.n_tokens, o.n_vocab, o.seed));
    pm.begin("prefill again (for the compression in place)");
    el::sequence seq     = s.prefill(p, o.n_decode, plan.needs);
    const phase  prefill = pm.end();
    pm.begin("compress in place " + o.methods[0] + " B=" + std::to_string(o.budgets[0]));
    seq.compress_in_place(plan.specs[0], params_at(o, o.budgets[0]));
    const phase ph = pm.end();
    return { prefill.peak_kib, ph.peak_kib, ph.rss_kib, seq.kv_bytes_allocated() };
}

// --repeats timed runs on the prefilled sequence, rewound to the prompt after each.
void decode_full(el::sequence & seq, const options & o, phase_meter & pm, full_result & full) {
    progress("[5/7] decode %d tokens from the full cache (%d repeats)\n", o.n_decode, o.repeats);
    pm.begin("decode, full cache");
    for (int32_t r = 0; r < o.repeats; ++r) {
        const decode_run run = timed_decode(seq, o.n_decode, o.threads);
        full.decode_s.push_back(sum(run.steps));
        full.cpu_share.push_back(run.cpu_share);
        progress("  repeat %d: %.2f s (%.2f tok/s, CPU share %.2f)\n", r + 1, full.decode_s.back(),
                 o.n_decode / full.decode_s.back(), run.cpu_share);
    }
    full.decode = pm.end();
}

void decode_compressed(const el::session & s, config_result & c, const options & o) {
    reset_peak();
    el::sequence     seq = s.resume(c.snap, ecokv::compression::none(), o.n_decode);
    const decode_run run = timed_decode(seq, o.n_decode, o.threads);
    c.decode_s.push_back(sum(run.steps));
    c.decode_steps.insert(c.decode_steps.end(), run.steps.begin(), run.steps.end());
    c.cpu_share.push_back(run.cpu_share);
    c.decode_peak_kib = std::max(c.decode_peak_kib, hwm_kib());
}

// An uncompressed sequence holding as many cells as the compressed one keeps per KV head on average (the same KV
// memory): a fresh prefill of that many tokens, no capture.
void decode_uncompressed(const el::session & s, config_result & c, const options & o) {
    reset_peak();
    el::sequence seq = s.prefill(s.make_prompt(random_tokens(c.kept_cells, o.n_vocab, o.seed + 7)), o.n_decode,
                                 ecokv::method_requirements{});
    c.base_prefill_s     = seq.prefill_seconds();
    const decode_run run = timed_decode(seq, o.n_decode, o.threads);
    c.base_decode_s.push_back(sum(run.steps));
    c.base_decode_steps.insert(c.base_decode_steps.end(), run.steps.begin(), run.steps.end());
    c.base_cpu_share.push_back(run.cpu_share);
    c.base_peak_kib = std::max(c.base_peak_kib, hwm_kib());
}

// Compressed vs uncompressed of the same length, interleaved, alternating which goes first.
void decode_comparisons(const el::session & s, std::vector<config_result> & results, const options & o) {
    progress("[6/7] decode %d tokens: compressed vs an uncompressed context of the same cells (%d repeats)\n",
             o.n_decode, o.repeats);
    for (int32_t r = 0; r < o.repeats; ++r) {
        for (auto & c : results) {
            for (int k = 0; k < 2; ++k) {
                if ((k == 0) == (r % 2 == 0)) {
                    decode_compressed(s, c, o);
                } else {
                    decode_uncompressed(s, c, o);
                }
            }
            progress("  repeat %d %-18s B=%-4d compressed %.2f tok/s (CPU share %.2f), uncompressed (%d tokens) %.2f "
                     "tok/s (CPU share %.2f)\n",
                     r + 1, c.method.c_str(), c.budget, o.n_decode / c.decode_s.back(), c.cpu_share.back(), c.kept_cells,
                     o.n_decode / c.base_decode_s.back(), c.base_cpu_share.back());
        }
    }
}

// --batch N: N copies of each compressed sequence in one context (a ragged pool: N x kept rows a head, N x n_decode
// cells), each step one llama_decode of every copy's next token; per step seconds, all repeats.
void decode_batched(const el::session & s, std::vector<config_result> & results, const options & o) {
    if (o.batch == 0) {
        return;
    }
    progress("[6b/7] decode %d tokens of %d copies together, one llama_decode a step (%d repeats)\n", o.n_decode,
             o.batch, o.repeats);
    for (auto & c : results) {
        const uint32_t widest = *std::max_element(c.snap.layout.begin(), c.snap.layout.end());
        for (int32_t r = 0; r < o.repeats; ++r) {
            el::batch b(s, { o.batch * (c.snap.n_cells + o.n_decode), o.batch * int32_t(widest), o.batch });
            std::vector<std::pair<int32_t, std::vector<llama_token>>> work;
            for (int32_t i = 0; i < o.batch; ++i) {
                work.push_back({ b.admit(c.snap, o.n_decode), { 0 } });
            }
            for (int32_t t = 0; t < o.n_decode; ++t) {
                for (auto & [seat, tokens] : work) {
                    tokens[0] = el::argmax(b.logits(seat));
                }
                const auto t0 = clock_type::now();
                b.step(work);
                c.batch_steps.push_back(seconds_since(t0));
            }
        }
        progress("  %-18s B=%-4d %d copies: step median %.4f s, %.2f tok/s (one copy alone: %.2f tok/s)\n",
                 c.method.c_str(), c.budget, o.batch, median(c.batch_steps), o.batch / median(c.batch_steps),
                 1 / median(c.decode_steps));
    }
}

// ---- report ----------------------------------------------------------------------------------------------------

// Decode speed is the best of the repeats (the machine's other load only ever adds time); the median run and the
// per-token medians are in the JSON and in the target lines.
json full_row(const full_result & f, const options & o) {
    const double dec = min_of(f.decode_s);
    return {
        { "method", "FullKV" }, { "budget", nullptr }, { "cells_per_head", o.n_tokens }, { "n_ctx", f.n_ctx },
        { "kv_bytes_allocated", f.kv_alloc }, { "kv_bytes_kept", f.kv_kept },
        { "peak_rss_decode_kib", f.decode.peak_kib },
        { "peak_rss_pipeline_kib", std::max(f.prefill.peak_kib, f.decode.peak_kib) },
        { "prefill_s", f.prefill_s }, { "prefill_cpu_share", f.prefill_cpu_share }, { "compress_s", 0.0 },
        { "select_s", 0.0 }, { "rebuild_s", 0.0 }, { "decode_s", dec }, { "decode_s_all", f.decode_s },
        { "decode_s_median", median(f.decode_s) }, { "cpu_share_all", f.cpu_share },
        { "decode_tokens_per_s", o.n_decode / dec },
    };
}

json config_row(const config_result & c, const full_result & f, const options & o) {
    const double   dec = min_of(c.decode_s), base = min_of(c.base_decode_s);
    const double   tps = o.n_decode / dec, base_tps = o.n_decode / base;
    const double   comp       = c.capture_s + c.select_s + c.rebuild_s;  // capture: copies from a device
    // kept entries + room for the decoded tokens in every compressed head, + an iSWA model's sliding-window stores
    // (llama.cpp's own: the window and a ubatch, padded to 256 cells, llama-kv-cache-iswa.cpp), 5% over, + 32 cells of
    // padding per compressed layer
    const uint64_t layer_cell = f.bytes_per_cell / uint64_t(o.n_layer);  // K and V of one cell in one layer
    const bool     iswa       = o.arch == "gemma3";
    const uint64_t n_global   = iswa ? uint64_t(o.n_layer / o.swa_pattern) : uint64_t(o.n_layer);
    const uint64_t swa_cells  = iswa ? (std::min(o.n_decode + o.sliding_window, o.sliding_window + o.n_ubatch) + 255) / 256 * 256 : 0;
    const uint64_t window     = (uint64_t(o.n_layer) - n_global) * swa_cells * layer_cell;
    const uint64_t room       = uint64_t(o.n_decode) * n_global * layer_cell;
    const uint64_t bound = uint64_t(1.05 * double(c.kv_kept + room + window)) + 32 * n_global * layer_cell;
    const uint64_t pipeline =
        std::max({ f.prefill.peak_kib, f.read.peak_kib, c.compress_peak_kib, c.decode_peak_kib });
    return {
        { "method", c.method }, { "budget", c.budget }, { "window", c.window }, { "cells_per_head", c.n_cells },
        { "kept_cells_per_head", c.kept_cells }, { "uniform", c.uniform }, { "kv_bytes_allocated", c.kv_alloc },
        { "kv_bytes_kept", c.kv_kept }, { "kv_bytes_room", room }, { "kv_bytes_window", window },
        { "kv_bytes_bound", bound },
        { "capture_s", c.capture_s }, { "bytes_to_host", c.bytes_to_host },
        { "device_bytes_of_compressed_context", c.device_context_bytes },
        { "kv_alloc_over_kept_plus_room", double(c.kv_alloc) / double(c.kv_kept + room + window) },
        { "peak_rss_decode_kib", c.decode_peak_kib }, { "peak_rss_pipeline_kib", pipeline },
        { "peak_rss_compress_kib", c.compress_peak_kib }, { "prefill_s", f.prefill_s }, { "compress_s", comp },
        { "select_s", c.select_s }, { "rebuild_s", c.rebuild_s }, { "compress_over_prefill", comp / f.prefill_s },
        { "decode_s", dec }, { "decode_s_all", c.decode_s }, { "decode_tokens_per_s", tps },
        { "decode_s_median", median(c.decode_s) }, { "uncompressed_decode_s_median", median(c.base_decode_s) },
        { "decode_speed_ratio_median_run", median(c.base_decode_s) / median(c.decode_s) },
        { "cpu_share_all", c.cpu_share }, { "uncompressed_cpu_share_all", c.base_cpu_share },
        { "uncompressed_prefill_s", c.base_prefill_s }, { "uncompressed_decode_s", base },
        { "uncompressed_decode_s_all", c.base_decode_s }, { "uncompressed_decode_tokens_per_s", base_tps },
        { "uncompressed_peak_rss_kib", c.base_peak_kib }, { "decode_speed_ratio", tps / base_tps },
        { "decode_step_median_s", median(c.decode_steps) },
        { "uncompressed_decode_step_median_s", median(c.base_decode_steps) },
        { "decode_speed_ratio_step_median", median(c.base_decode_steps) / median(c.decode_steps) },
        { "batch_sequences", o.batch },
        { "batch_step_median_s", c.batch_steps.empty() ? json() : json(median(c.batch_steps)) },
        { "batch_tokens_per_s", c.batch_steps.empty() ? json() : json(o.batch / median(c.batch_steps)) },
    };
}

json target_of(const json & row, const full_result & f) {
    const double comp = row["compress_s"].get<double>();
    return {
        { "method", row["method"] }, { "budget", row["budget"] },
        { "decode_within_3pct", row["decode_speed_ratio"].get<double>() >= 0.97 },
        { "decode_ratio", row["decode_speed_ratio"] },
        { "decode_ratio_step_median", row["decode_speed_ratio_step_median"] },
        { "decode_ratio_median_run", row["decode_speed_ratio_median_run"] },
        { "compress_under_2pct", comp < 0.02 * f.prefill_s }, { "compress_pct", 100 * comp / f.prefill_s },
        { "kv_alloc_within_bound", row["kv_bytes_allocated"] <= row["kv_bytes_bound"] },
    };
}

// The pipeline's peak with the compression in place against the prefill's peak plus the compressed cache.
json in_place_row(const in_place_result & ip, const options & o) {
    const uint64_t bound = uint64_t(1.05 * double(ip.prefill_peak_kib)) + ip.kv_alloc / 1024;
    return { { "method", o.methods[0] }, { "budget", o.budgets[0] }, { "peak_rss_prefill_kib", ip.prefill_peak_kib },
             { "peak_rss_compress_kib", ip.peak_kib }, { "rss_after_kib", ip.rss_kib },
             { "kv_bytes_allocated", ip.kv_alloc }, { "peak_bound_kib", bound },
             { "peak_within_bound", std::max(ip.prefill_peak_kib, ip.peak_kib) <= bound } };
}

json make_report(const options & o, const model_info & mi, const full_result & f, const in_place_result & ip,
                 const std::vector<config_result> & results, const phase_meter & pm, double total_s) {
    json rows = json::array({ full_row(f, o) }), targets = json::array();
    for (const auto & c : results) {
        rows.push_back(config_row(c, f, o));
        targets.push_back(target_of(rows.back(), f));
    }
    return {
        { "model", model_json(o, mi) },
        { "tokens", o.n_tokens }, { "n_decode", o.n_decode }, { "repeats", o.repeats }, { "threads", o.threads },
        { "ubatch", o.n_ubatch }, { "flash_attn", o.flash_attn }, { "cache_type_k", engine_text(o, "cache_type_k") },
        { "cache_type_v", engine_text(o, "cache_type_v") }, { "kv_bytes_per_cell", f.bytes_per_cell },
        { "peak_reset_works", pm.hwm_reset_works }, { "total_s", total_s },
        { "phases", phases_json(pm.phases) }, { "rows", rows }, { "targets", targets }, { "in_place", in_place_row(ip, o) },
    };
}

void print_rows(const json & out) {
    std::printf("%-22s %6s %6s %9s %8s %9s %9s %8s %12s %8s %8s %9s %7s\n", "Method", "Budget", "Kept", "KV alloc",
                "KV kept", "Peak RSS", "Peak RSS", "Prefill", "Compress", "Decode", "Decode", "Uncompr.", "Ratio");
    std::printf("%-22s %6s %6s %9s %8s %9s %9s %8s %12s %8s %8s %9s %7s\n", "", "", "/head", "MiB", "MiB", "decode",
                "pipeline", "s", "s (%pf)", "s", "tok/s", "tok/s", "");
    for (const auto & r : out["rows"]) {
        const bool        full = r["method"] == "FullKV";
        const std::string budget = full ? "-" : std::to_string(r["budget"].get<int>());
        const std::string comp   = full ? "-"
                                        : fmt("%.3f", r["compress_s"].get<double>()) + " (" +
                                            fmt("%.2f", 100 * r["compress_over_prefill"].get<double>()) + ")";
        const std::string base   = full ? "-" : fmt("%.2f", r["uncompressed_decode_tokens_per_s"].get<double>());
        const std::string ratio  = full ? "-" : fmt("%.3f", r["decode_speed_ratio"].get<double>());
        std::printf("%-22s %6s %6d %9.2f %8.2f %9.0f %9.0f %8.1f %12s %8.2f %8.2f %9s %7s\n",
                    r["method"].get<std::string>().c_str(), budget.c_str(),
                    (full ? r["cells_per_head"] : r["kept_cells_per_head"]).get<int>(),
                    mib(r["kv_bytes_allocated"].get<uint64_t>()), mib(r["kv_bytes_kept"].get<uint64_t>()),
                    kib_to_mib(r["peak_rss_decode_kib"].get<uint64_t>()),
                    kib_to_mib(r["peak_rss_pipeline_kib"].get<uint64_t>()), r["prefill_s"].get<double>(),
                    comp.c_str(), r["decode_s"].get<double>(), r["decode_tokens_per_s"].get<double>(), base.c_str(),
                    ratio.c_str());
    }
}

void print_targets(const json & out) {
    std::printf("\nTargets:\n");
    const json & rows = out["rows"];
    for (size_t i = 0; i < out["targets"].size(); ++i) {
        const json & t = out["targets"][i];
        const json & r = rows[i + 1];
        const auto   met = [&](const char * key) { return t[key].get<bool>() ? "MET" : "NOT MET"; };
        std::printf("  %-18s B=%-4d decode %.2f vs %.2f tok/s uncompressed: ratio %.3f %s (median runs %.3f, per-token "
                    "medians %.3f) | compress %.3f s = %.2f%% of prefill %s | KV %.3f MiB = %.3f x (kept + room%s), "
                    "<= %.3f MiB %s\n",
                    r["method"].get<std::string>().c_str(), r["budget"].get<int>(),
                    r["decode_tokens_per_s"].get<double>(), r["uncompressed_decode_tokens_per_s"].get<double>(),
                    t["decode_ratio"].get<double>(), met("decode_within_3pct"),
                    t["decode_ratio_median_run"].get<double>(), t["decode_ratio_step_median"].get<double>(),
                    r["compress_s"].get<double>(), t["compress_pct"].get<double>(), met("compress_under_2pct"),
                    mib(r["kv_bytes_allocated"].get<uint64_t>()), r["kv_alloc_over_kept_plus_room"].get<double>(),
                    r["kv_bytes_window"].get<uint64_t>() > 0 ? " + window stores" : "",
                    mib(r["kv_bytes_bound"].get<uint64_t>()), met("kv_alloc_within_bound"));
    }
    const json & ip = out["in_place"];
    std::printf("  in place %s B=%d: peak RSS %.0f MiB (prefill %.0f MiB) <= prefill + compressed cache + 5%% = %.0f "
                "MiB %s\n",
                ip["method"].get<std::string>().c_str(), ip["budget"].get<int>(),
                kib_to_mib(ip["peak_rss_compress_kib"].get<uint64_t>()), kib_to_mib(ip["peak_rss_prefill_kib"].get<uint64_t>()),
                kib_to_mib(ip["peak_bound_kib"].get<uint64_t>()), ip["peak_within_bound"].get<bool>() ? "MET" : "NOT MET");
}

void print_tables(const json & out, const options & o, const phase_meter & pm) {
    const json & m = out["model"];
    std::printf("bench-decode: %s, %d layers, n_embd %d, %d/%d heads (head_dim %d), n_ff %d, vocab %d, %s weights "
                "(%.2f B params, %.0f MiB)\n",
                o.arch.c_str(), o.n_layer, o.n_embd, o.n_head, o.n_head_kv, o.n_embd / o.n_head, o.n_ff, o.n_vocab,
                o.wtype.c_str(), double(m["n_params"].get<int64_t>()) / 1e9, mib(m["weight_bytes"].get<uint64_t>()));
    std::printf("prompt %d random tokens, decode %d tokens, %d threads, ubatch %d, flash attention %s, decode = best "
                "of %d repeats, %s/%s K/V (%.0f KiB per cell)\n\n",
                o.n_tokens, o.n_decode, o.threads, o.n_ubatch, o.flash_attn.c_str(), o.repeats,
                engine_text(o, "cache_type_k").c_str(), engine_text(o, "cache_type_v").c_str(),
                double(out["kv_bytes_per_cell"].get<uint64_t>()) / 1024);
    print_rows(out);

    double min_share = 1e9;
    for (const auto & r : out["rows"]) {
        for (const char * key : { "cpu_share_all", "uncompressed_cpu_share_all" }) {
            if (r.contains(key)) {
                min_share = std::min(min_share, min_of(r[key].get<std::vector<double>>()));
            }
        }
    }
    std::printf("\nCPU share (CPU seconds / (wall x %d threads); below ~0.95 another process took the cores): prefill "
                "%.2f, decode runs min %.2f\n",
                o.threads, out["rows"][0]["prefill_cpu_share"].get<double>(), min_share);

    std::printf("\nRSS by phase (peak = VmHWM reset at the phase start%s):\n",
                pm.hwm_reset_works ? "" : "; reset FAILED, peaks are since process start");
    for (const auto & ph : pm.phases) {
        if (ph.name.rfind("idle", 0) == 0) {
            std::printf("  %-52s RSS %7.0f MiB\n", ph.name.c_str(), kib_to_mib(ph.rss_kib));
        } else {
            std::printf("  %-52s %8.2f s  RSS %7.0f MiB  peak %7.0f MiB\n", ph.name.c_str(), ph.seconds,
                        kib_to_mib(ph.rss_kib), kib_to_mib(ph.peak_kib));
        }
    }
    print_targets(out);
    std::printf("\ntotal %.0f s\n", out["total_s"].get<double>());
}

void write_report(const json & out, const options & o, const phase_meter & pm) {
    if (!o.json_file.empty()) {  // temporary file + rename: an interrupted or failed write leaves nothing
        ecokv::write_file_atomic(o.json_file, out.dump(1) + "\n");
    }
    if (o.json) {
        std::printf("%s\n", out.dump(1).c_str());
    } else {
        print_tables(out, o, pm);
    }
}

// ---- main ------------------------------------------------------------------------------------------------------

int run(options o) {
    el::set_verbose(o.verbose);
    const method_plan plan  = plan_methods(o);
    const auto        t_all = clock_type::now();
    phase_meter       pm;

    progress("[1/7] building a random-weight %s model in memory: %d layers, n_embd %d, %d/%d heads, n_ff %d, "
             "vocab %d, %s weights\n",
             o.arch.c_str(), o.n_layer, o.n_embd, o.n_head, o.n_head_kv, o.n_ff, o.n_vocab, o.wtype.c_str());
    pm.begin("build model");
    model_info  mi;
    el::session session(build_model(o, mi), o.engine);
    const phase ph_model = pm.end();
    progress("  %.2f B parameters, %.0f MiB of weights, %.1f s, RSS %.0f MiB\n", double(mi.n_params) / 1e9,
             mib(mi.weight_bytes), ph_model.seconds, kib_to_mib(ph_model.rss_kib));

    full_result                 full;
    std::optional<el::sequence> seq = prefill(session, o, plan.needs, pm, full);
    read_state(*seq, pm, full);
    std::vector<config_result> results = compress_all(*seq, o, plan, pm);
    decode_full(*seq, o, pm, full);
    seq.reset();
    pm.begin("idle after freeing the prefill context");
    pm.end();
    decode_comparisons(session, results, o);
    decode_batched(session, results, o);
    for (auto & c : results) {
        c.snap = {};
    }
    const in_place_result ip = compress_in_place(session, o, plan, pm);

    write_report(make_report(o, mi, full, ip, results, pm, seconds_since(t_all)), o, pm);
    if (o.synthetic_head_scores) {
        std::filesystem::remove(o.base.params.head_scores);
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    return run_main("bench-decode", [&] {
        const std::optional<options> o = parse_options(argc, argv);
        return o ? run(*o) : 0;
    });
}
