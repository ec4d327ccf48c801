// What the llama.cpp benchmarks share: see bench-common.h.
#include "bench-common.h"

#include "seeded-random.h"
#include "tiny-model.h"

#include "common/engine-flags.h"
#include "ecokv/error.h"
#include "ecokv/llama-options.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace ecokv::bench {

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

void progress(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fflush(stderr);
}

int32_t bounded(const cxxopts::ParseResult & args, const std::string & name, int32_t lo) {
    const int32_t v = args[name].as<int32_t>();
    if (v < lo || v > 1000000) {
        throw error("--" + name + " " + std::to_string(v) + ": expected an integer in [" + std::to_string(lo) +
                    ", 1000000]");
    }
    return v;
}

std::string one_of(const cxxopts::ParseResult & args, const std::string & name,
                   const std::vector<std::string> & allowed) {
    const std::string v = args[name].as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
        std::string list;
        for (const auto & a : allowed) {
            list += (list.empty() ? "" : ", ") + a;
        }
        throw error("--" + name + " " + v + ": expected one of " + list);
    }
    return v;
}

void add_model_options(cxxopts::Options & spec) {
    const auto i32 = [](const char * d) { return cxxopts::value<int32_t>()->default_value(d); };
    const auto str = [](const char * d) { return cxxopts::value<std::string>()->default_value(d); };
    // clang-format off
    spec.add_options()
        ("wtype", "weight type of the matrices: q8_0, q4_0, f16, f32", str("q8_0"), "T")
        ("arch", "qwen2vl, llama or gemma3 (sliding-window layers beside global ones)", str("qwen2vl"), "A")
        ("seed", "weights and prompt", cxxopts::value<uint64_t>()->default_value("1"), "S");
    spec.add_options("model shape (Qwen2-VL-2B, vocabulary reduced)")
        ("layers", "layers", i32("28"), "N")
        ("embd", "embedding width", i32("1536"), "N")
        ("heads", "query heads", i32("12"), "N")
        ("kv-heads", "KV heads", i32("2"), "N")
        ("ff", "feed-forward width", i32("8960"), "N")
        ("vocab", "vocabulary", i32("32768"), "N")
        ("swa", "gemma3: sliding window (positions)", i32("512"), "N")
        ("swa-pattern", "gemma3: every N-th layer global, the others sliding-window", i32("6"), "N");
    // clang-format on
    tools::add_engine_options(spec, bench_engine_defaults());
}

llama::session_options bench_engine_defaults() {
    llama::session_options so;
    so.n_threads = 2;
    so.n_batch   = 512;
    so.n_ubatch  = 512;
    return so;
}

int run_main(const char * name, const std::function<int()> & body) {
    try {
        return body();
    } catch (const cxxopts::exceptions::exception & e) {
        std::fprintf(stderr, "%s: error: %s (see --help)\n", name, e.what());
    } catch (const std::exception & e) {
        std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    }
    return 1;
}

std::optional<cxxopts::ParseResult> parse_bench_options(cxxopts::Options & spec, int argc, char ** argv) {
    // clang-format off
    spec.add_options()
        ("json", "print one JSON object on stdout instead of the tables")
        ("json-file", "also write that JSON object to PATH", cxxopts::value<std::string>(), "PATH")
        ("verbose", "show llama.cpp's log")
        ("h,help", "show this help");
    // clang-format on
    add_model_options(spec);
    return tools::parse_engine_command(spec, argc, argv);
}

output_options read_output_options(const cxxopts::ParseResult & args) {
    output_options o;
    o.json      = args.count("json") > 0;
    o.verbose   = args.count("verbose") > 0;
    o.json_file = args.count("json-file") ? args["json-file"].as<std::string>() : "";
    return o;
}

model_shape read_model_options(const cxxopts::ParseResult & args) {
    model_shape m;
    m.engine     = tools::engine_options_from(args, bench_engine_defaults());
    m.threads    = m.engine.n_threads;
    m.n_ubatch   = m.engine.n_ubatch;
    m.flash_attn = option_text(llama::get_engine_option(m.engine, "flash_attn"));
    if (m.threads < 1) {
        throw error("--threads must be at least 1 here (the bench's CPU shares divide by it)");
    }
    m.n_layer    = bounded(args, "layers", 1);
    m.n_embd     = bounded(args, "embd", 1);
    m.n_head     = bounded(args, "heads", 1);
    m.n_head_kv  = bounded(args, "kv-heads", 1);
    m.n_ff       = bounded(args, "ff", 1);
    m.n_vocab    = bounded(args, "vocab", 2);
    m.wtype      = one_of(args, "wtype", { "q8_0", "q4_0", "f16", "f32" });
    m.arch       = one_of(args, "arch", { "qwen2vl", "llama", "gemma3" });
    m.sliding_window = bounded(args, "swa", 1);
    m.swa_pattern    = bounded(args, "swa-pattern", 2);
    m.seed       = args["seed"].as<uint64_t>();
    if (m.n_embd % m.n_head != 0 || m.n_head % m.n_head_kv != 0 || m.head_dim() % 2 != 0) {
        throw error("model shape: need n_embd % n_head == 0, n_head % n_kv_heads == 0 and an even head_dim");
    }
    return m;
}

int64_t device_used_bytes() {
    const auto devices = llama::list_devices();
    int64_t    used    = devices.empty() ? -1 : 0;
    for (const llama::device_info & d : devices) {
        used += int64_t(d.total_bytes) - int64_t(d.free_bytes);
    }
    return used;
}

llama::model_ptr build_model(const model_shape & m, model_info & info) {
    test::tiny_config c;
    c.arch           = m.arch;
    c.n_layer        = m.n_layer;
    c.n_embd         = m.n_embd;
    c.n_head         = m.n_head;
    c.n_head_kv      = m.n_head_kv;
    c.n_ff           = m.n_ff;
    c.n_vocab        = m.n_vocab;
    c.n_ctx_train    = k_n_ctx_train;
    c.rope_freq_base = 1e6f;
    // Qwen2-VL's mrope_section [16, 24, 24] (rotation pairs; head_dim/2 = 64 at head_dim 128), scaled otherwise
    const int32_t half = c.head_dim() / 2, t = half / 4, y = (half - t) / 2;
    c.rope_sections          = { t, y, half - t - y, 0 };
    c.sliding_window         = m.sliding_window;
    c.swa_pattern            = m.swa_pattern;
    c.seed                   = m.seed;
    c.weight_type            = m.wtype;
    c.keep_reference_weights = false;
    c.n_threads              = m.threads;
    c.n_gpu_layers           = m.engine.llama_gpu_layers();
    c.on_progress            = [last = -1](uint64_t done, uint64_t total) mutable {
        const int pct = int(std::min<uint64_t>(100, 100 * done / std::max<uint64_t>(total, 1)));
        if (pct / 10 != last / 10) {
            progress("  weights %3d%%\n", pct);
            last = pct;
        }
    };
    test::tiny_model tm = test::make_tiny_model(c);
    info                = { tm.n_params(), tm.n_bytes() };
    return llama::model_ptr(tm.release());
}

nlohmann::json model_json(const model_shape & m, const model_info & info) {
    return { { "arch", m.arch },       { "n_layer", m.n_layer },   { "n_embd", m.n_embd },
             { "n_head", m.n_head },   { "n_head_kv", m.n_head_kv }, { "head_dim", m.head_dim() },
             { "n_ff", m.n_ff },       { "n_vocab", m.n_vocab },   { "weights", m.wtype },
             { "sliding_window", m.arch == "gemma3" ? m.sliding_window : 0 },
             { "swa_pattern", m.arch == "gemma3" ? m.swa_pattern : 0 },
             { "n_params", info.n_params }, { "weight_bytes", info.weight_bytes } };
}

std::vector<llama_token> random_tokens(int32_t n, int32_t n_vocab, uint64_t seed) {
    test::splitmix64         rng{ seed * 0x9e3779b97f4a7c15ull + 12345 };
    std::vector<llama_token> out(static_cast<size_t>(n));
    for (auto & t : out) {
        t = llama_token(rng.next() % uint64_t(n_vocab));
    }
    return out;
}

namespace {

uint64_t status_kib(const char * key) {
    std::ifstream in("/proc/self/status");
    std::string   line;
    const size_t  n = std::strlen(key);
    while (std::getline(in, line)) {
        if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') {
            return std::strtoull(line.c_str() + n + 1, nullptr, 10);
        }
    }
    return 0;
}

}  // namespace

uint64_t rss_kib() { return status_kib("VmRSS"); }

uint64_t hwm_kib() { return status_kib("VmHWM"); }

bool reset_peak() {
    std::ofstream out("/proc/self/clear_refs");
    out << "5";
    out.flush();
    return bool(out);
}

double cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

void phase_meter::begin(std::string n) {
    name            = std::move(n);
    hwm_reset_works = reset_peak() && hwm_reset_works;
    t0              = clock_type::now();
}

phase phase_meter::end() {
    phase p{ name, seconds_since(t0), rss_kib(), hwm_kib() };
    phases.push_back(p);
    return p;
}

nlohmann::json phases_json(const std::vector<phase> & phases) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto & ph : phases) {
        out.push_back({ { "phase", ph.name }, { "seconds", ph.seconds }, { "rss_kib", ph.rss_kib },
                        { "peak_kib", ph.peak_kib } });
    }
    return out;
}

}  // namespace ecokv::bench
