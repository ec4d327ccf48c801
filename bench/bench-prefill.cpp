// bench-prefill: peak memory and time of a long prompt's prefill inside llama.cpp, one shot or chunked (issue 12).
//
// One mode per process, so that the process's peak resident set is the mode's own and a memory limit (a cgroup)
// applies to it alone:
//   full      prefill of the whole prompt, uncompressed (the baseline of prefill tokens/s);
//   one-shot  the same prefill, then compression in place to --budget with --method (the full cache exists first);
//   chunked   session::prefill with compression.chunk: --chunk cells at a time, compressed back to the budget after every chunk.
// Then --n-decode greedy tokens, so that the cache is shown usable. The model is the random-weight one of
// bench-decode (Qwen2-VL-2B's text geometry by default, bench-common.h); the prompt is random token ids. Prints a
// table, or one JSON object with --json. bench/bench-prefill.sh runs the modes side by side at 2k, 8k and 32k
// tokens, and under a memory limit. See bench/bench-prefill.md. Usage: bench-prefill --help
#include "bench-common.h"

#include "ecokv/error.h"
#include "ecokv/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

namespace {

namespace el = ecokv::llama;
using namespace ecokv::bench;
using json = nlohmann::json;

struct options : model_shape, output_options {
    std::string         mode = "chunked";
    int32_t             n_tokens = 8192, n_decode = 16;
    ecokv::compression  c = defaults();  // chunk: of the chunked mode

    static ecokv::compression defaults() {
        ecokv::compression c;
        c.params.budget = 256;
        c.chunk         = 512;
        return c;
    }
};

cxxopts::Options option_spec() {
    cxxopts::Options spec("bench-prefill", "Peak memory and time of a long prompt's prefill inside llama.cpp: full, "
                                           "one shot then compressed, or chunked with compression after every chunk.");
    const auto i32 = [](const char * d) { return cxxopts::value<int32_t>()->default_value(d); };
    const auto str = [](const char * d) { return cxxopts::value<std::string>()->default_value(d); };
    // clang-format off
    spec.add_options()
        ("mode", "full, one-shot or chunked", str("chunked"), "M")
        ("tokens", "prompt length (random token ids)", i32("8192"), "N")
        ("n-decode", "greedy tokens decoded and timed after the prefill (and one warm-up token)", i32("16"), "N");
    // clang-format on
    // The method of one-shot and chunked, and --chunk of chunked; --seed is the bench's (weights and prompt).
    ecokv::tools::add_compression_options(spec, ecokv::scope_method | ecokv::scope_prefill, options::defaults(),
                                          { "seed" });
    return spec;
}

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
    o.mode                        = one_of(args, "mode", { "full", "one-shot", "chunked" });
    o.n_tokens                    = bounded(args, "tokens", 1);
    o.n_decode                    = bounded(args, "n-decode", 1);
    o.c                           = ecokv::tools::compression_from(args, options::defaults());
    if (o.mode != "chunked") {
        o.c.chunk = 0;
    } else if (o.c.chunk == 0) {
        throw ecokv::error("--chunk 0: the chunked mode needs chunks (--mode one-shot compresses the whole prompt)");
    }
    o.c.validate();
    if (o.n_tokens + o.n_decode + 1 > k_n_ctx_train) {
        throw ecokv::error("--tokens + --n-decode + 1 must fit the model's 32768-token context");
    }
    return o;
}

// The prompt through the mode's pipeline, each step a phase.
el::sequence prefill(const el::session & s, const options & o, phase_meter & pm, double & cpu_share) {
    const el::prompt p = s.make_prompt(random_tokens(o.n_tokens, o.n_vocab, o.seed));
    progress("[2/3] %s prefill of %d tokens\n", o.mode.c_str(), o.n_tokens);
    const double cpu0 = cpu_seconds();
    const auto   w0   = clock_type::now();
    // The mode's compression applied by the session's one entry: none, one shot then in place, or chunk by chunk.
    ecokv::compression c = o.mode == "full" ? ecokv::compression::none() : o.c;
    c.chunk              = o.mode == "chunked" ? o.c.chunk : 0;
    pm.begin(o.mode == "chunked" ? "chunked prefill (decode + compress per chunk)"
             : o.mode == "full"  ? "prefill"
                                 : "prefill, then compress in place");
    el::sequence seq = s.prefill(p, c, o.n_decode + 1);
    const phase  ph  = pm.end();
    cpu_share = (cpu_seconds() - cpu0) / (seconds_since(w0) * o.threads);
    progress("  %.1f s, RSS %.0f MiB\n", seconds_since(w0), kib_to_mib(ph.rss_kib));
    return seq;
}

json make_report(const options & o, const model_info & mi, const el::sequence & seq, const phase_meter & pm,
                 double cpu_share, double decode_s, uint64_t peak_kib) {
    const el::compression_info &    ci        = seq.compression();
    const double                    compress_s = ci.select_seconds + ci.rebuild_seconds;
    const double                    prompt_s   = seq.prefill_seconds() + compress_s;
    json                            out        = {
        { "mode", o.mode },
        { "tokens", o.n_tokens },
        { "chunk", o.mode == "chunked" ? o.c.chunk : 0 },
        { "method", o.mode == "full" ? std::string(ecokv::k_full_cache) : o.c.spec.name() },
        { "budget", o.mode == "full" ? 0 : o.c.params.budget },
        { "model", model_json(o, mi) },
        { "threads", o.threads },
        { "ubatch", o.n_ubatch },
        { "flash_attn", o.flash_attn },
        { "rss_model_kib", pm.phases.front().rss_kib },
        { "peak_rss_kib", peak_kib },  // the whole process, model building included
        { "peak_reset_works", pm.hwm_reset_works },
        { "prefill_s", seq.prefill_seconds() },
        { "compress_s", compress_s },
        { "prompt_tokens_per_s", o.n_tokens / prompt_s },
        { "prefill_cpu_share", cpu_share },
        { "peak_kv_cells", seq.peak_kv_cells() },
        { "peak_kv_bytes", seq.peak_kv_bytes() },
        { "kv_bytes_allocated", seq.kv_bytes_allocated() },
        { "kv_bytes_kept", seq.kv_bytes_kept() },
        { "kv_bytes_per_cell", seq.kv_bytes_per_cell() },
        { "decode_tokens_per_s", o.n_decode / decode_s },
        { "phases", phases_json(pm.phases) },
    };
    return out;
}

void print_table(const json & r) {
    std::printf("%s, %d tokens%s, %s B=%d, %s weights, %d threads\n", r["mode"].get<std::string>().c_str(),
                r["tokens"].get<int>(),
                r["chunk"].get<int>() ? (", chunk " + std::to_string(r["chunk"].get<int>())).c_str() : "",
                r["method"].get<std::string>().c_str(), r["budget"].get<int>(),
                r["model"]["weights"].get<std::string>().c_str(), r["threads"].get<int>());
    std::printf("%-48s %10s %10s %10s\n", "phase", "seconds", "RSS MiB", "peak MiB");
    for (const auto & ph : r["phases"]) {
        std::printf("%-48s %10.2f %10.0f %10.0f\n", ph["phase"].get<std::string>().c_str(),
                    ph["seconds"].get<double>(), kib_to_mib(ph["rss_kib"].get<uint64_t>()),
                    kib_to_mib(ph["peak_kib"].get<uint64_t>()));
    }
    std::printf("peak RSS %.0f MiB (model %.0f MiB); peak KV %d cells per head, %.1f MiB; after: %.1f MiB allocated\n",
                kib_to_mib(r["peak_rss_kib"].get<uint64_t>()), kib_to_mib(r["rss_model_kib"].get<uint64_t>()),
                r["peak_kv_cells"].get<int>(), mib(r["peak_kv_bytes"].get<uint64_t>()),
                mib(r["kv_bytes_allocated"].get<uint64_t>()));
    std::printf("prefill %.2f s + compression %.3f s: %.1f prompt tokens/s (CPU share %.2f); decode %.1f tokens/s\n",
                r["prefill_s"].get<double>(), r["compress_s"].get<double>(), r["prompt_tokens_per_s"].get<double>(),
                r["prefill_cpu_share"].get<double>(), r["decode_tokens_per_s"].get<double>());
}

int run(const options & o) {
    el::set_verbose(o.verbose);
    phase_meter pm;
    progress("[1/3] building a random-weight %s model: %d layers, n_embd %d, %d/%d heads, n_ff %d, vocab %d, %s\n",
             o.arch.c_str(), o.n_layer, o.n_embd, o.n_head, o.n_head_kv, o.n_ff, o.n_vocab, o.wtype.c_str());
    pm.begin("build model");
    model_info  mi;
    el::session session(build_model(o, mi), o.engine);
    pm.end();

    double       cpu_share = 0;
    el::sequence seq       = prefill(session, o, pm, cpu_share);
    progress("[3/3] decoding %d tokens\n", o.n_decode);
    llama_token tok = el::argmax(seq.logits());
    seq.decode({ tok });  // warm-up: the first decode after a prefill reserves the single-token graph
    tok = el::argmax(seq.logits());
    pm.begin("decode");
    for (int32_t i = 0; i < o.n_decode; ++i) {
        seq.decode({ tok });
        tok = el::argmax(seq.logits());
    }
    const double decode_s = pm.end().seconds;

    uint64_t peak_kib = 0;  // each phase's peak (VmHWM reset at its start): the largest is the process's
    for (const phase & ph : pm.phases) {
        peak_kib = std::max(peak_kib, ph.peak_kib);
    }
    const json out = make_report(o, mi, seq, pm, cpu_share, decode_s, peak_kib);
    if (!o.json_file.empty()) {
        ecokv::write_file_atomic(o.json_file, out.dump(1) + "\n");
    }
    if (o.json) {
        std::printf("%s\n", out.dump(1).c_str());
    } else {
        print_table(out);
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    return run_main("bench-prefill", [&] {
        const std::optional<options> o = parse_options(argc, argv);
        return o ? run(*o) : 0;
    });
}
