// bench-decode: end-to-end cost of KV-cache compression inside llama.cpp at a realistic model shape.
//
// Builds a random-weight model with Qwen2-VL-2B's text geometry in memory (llama_model_init_from_user, no file,
// weights quantized to Q8_0 by default), prefills N random token ids, then for the full cache and for every
// (method, budget) measures KV memory (allocated and kept), RSS per phase, prefill time, compression time
// (select + rebuild), decode time and tokens/s over --n-decode tokens, and the decode tokens/s of an
// *uncompressed* context of the same length as the compressed one (a fresh prefill of that many tokens).
// Prints a table in the spirit of Table 5 of the ECOKV paper, and checks three targets:
//   decode tok/s(compressed) >= 0.95 x tok/s(uncompressed, same length);
//   compression time < 2% of the prefill time;
//   KV bytes allocated <= roundup256(kept cells + n_decode) x bytes per cell.
// See bench/bench-decode.md. Usage: bench-decode --help
#include "seeded-random.h"
#include "ecokv/error.h"
#include "ecokv/llama-adapter.h"
#include "ecokv/llama-generate.h"

#include <ggml-backend.h>
#include <ggml.h>
#include <gguf.h>
#include <llama.h>

#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace el = ecokv::llama;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// ---- options ---------------------------------------------------------------------------------------------------

struct options {
    int32_t                  n_tokens  = 8192;
    int32_t                  n_decode  = 64;
    std::vector<int32_t>     budgets   = { 64, 256 };
    std::vector<std::string> methods   = { "snapkv+ecokv" };
    int32_t                  threads   = 2;
    int32_t                  repeats   = 5;
    int32_t                  n_ubatch  = 512;
    std::string              arch      = "qwen2vl";
    std::string              wtype     = "q8_0";
    std::string              flash_attn = "auto";
    int32_t                  n_layer = 28, n_embd = 1536, n_head = 12, n_head_kv = 2, n_ff = 8960, n_vocab = 32768;
    uint64_t                 seed      = 1;
    bool                     json      = false;
    std::string              json_file;
    bool                     verbose   = false;
};

const char * k_usage =
    "usage: bench-decode [options]\n"
    "  --tokens N        prompt length (random token ids)                      [8192]\n"
    "  --n-decode N      tokens decoded per measurement                        [64]\n"
    "  --budgets LIST    comma-separated budgets (tokens kept per KV head)     [64,256]\n"
    "  --methods LIST    comma-separated methods, e.g. snapkv+ecokv,pyramidkv+ecokv [snapkv+ecokv]\n"
    "  --repeats N       decode runs per configuration (best and median)     [5]\n"
    "  --threads N       CPU threads (ggml and the ecokv core)                 [2]\n"
    "  --ubatch N        prefill micro-batch                                   [512]\n"
    "  --wtype T         weight type of the matrices: q8_0, q4_0, f16, f32      [q8_0]\n"
    "  --arch A          qwen2vl or llama                                      [qwen2vl]\n"
    "  --flash-attn M    auto, on or off, for every context (a per-head bias,\n"
    "                    i.e. non-uniform budgets, always runs without it)     [auto]\n"
    "  --layers N --embd N --heads N --kv-heads N --ff N --vocab N\n"
    "                    model shape                  [28 1536 12 2 8960 32768: Qwen2-VL-2B, vocab reduced]\n"
    "  --seed S          weights and prompt                                    [1]\n"
    "  --json            print one JSON object on stdout instead of the tables\n"
    "  --json-file PATH  also write that JSON object to PATH\n"
    "  --verbose         show llama.cpp's log\n";

std::vector<std::string> split(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream        ss(s);
    std::string              item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) {
            out.push_back(item);
        }
    }
    return out;
}

int32_t to_int(const std::string & opt, const std::string & v, int32_t lo) {
    char *     end = nullptr;
    const long x   = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || x < lo || x > 1000000) {
        throw ecokv::error(opt + " " + v + ": expected an integer >= " + std::to_string(lo));
    }
    return int32_t(x);
}

options parse(int argc, char ** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                throw ecokv::error(a + ": missing value");
            }
            return argv[++i];
        };
        if (a == "-h" || a == "--help") {
            std::fputs(k_usage, stdout);
            std::exit(0);
        } else if (a == "--tokens") {
            o.n_tokens = to_int(a, value(), 1);
        } else if (a == "--n-decode") {
            o.n_decode = to_int(a, value(), 1);
        } else if (a == "--budgets") {
            o.budgets.clear();
            for (const auto & b : split(value())) {
                o.budgets.push_back(to_int(a, b, 1));
            }
        } else if (a == "--methods") {
            o.methods = split(value());
        } else if (a == "--repeats") {
            o.repeats = to_int(a, value(), 1);
        } else if (a == "--threads") {
            o.threads = to_int(a, value(), 1);
        } else if (a == "--ubatch") {
            o.n_ubatch = to_int(a, value(), 1);
        } else if (a == "--wtype") {
            o.wtype = value();
        } else if (a == "--flash-attn") {
            o.flash_attn = value();
            if (o.flash_attn != "auto" && o.flash_attn != "on" && o.flash_attn != "off") {
                throw ecokv::error("--flash-attn " + o.flash_attn + ": expected auto, on or off");
            }
        } else if (a == "--arch") {
            o.arch = value();
        } else if (a == "--layers") {
            o.n_layer = to_int(a, value(), 1);
        } else if (a == "--embd") {
            o.n_embd = to_int(a, value(), 1);
        } else if (a == "--heads") {
            o.n_head = to_int(a, value(), 1);
        } else if (a == "--kv-heads") {
            o.n_head_kv = to_int(a, value(), 1);
        } else if (a == "--ff") {
            o.n_ff = to_int(a, value(), 1);
        } else if (a == "--vocab") {
            o.n_vocab = to_int(a, value(), 2);
        } else if (a == "--seed") {
            o.seed = uint64_t(to_int(a, value(), 0));
        } else if (a == "--json") {
            o.json = true;
        } else if (a == "--json-file") {
            o.json_file = value();
        } else if (a == "--verbose") {
            o.verbose = true;
        } else {
            throw ecokv::error("unknown option " + a + " (see --help)");
        }
    }
    if (o.budgets.empty() || o.methods.empty()) {
        throw ecokv::error("--budgets and --methods need at least one entry");
    }
    if (o.arch != "qwen2vl" && o.arch != "llama") {
        throw ecokv::error("--arch " + o.arch + ": expected qwen2vl or llama");
    }
    if (o.n_embd % o.n_head != 0 || o.n_head % o.n_head_kv != 0 || (o.n_embd / o.n_head) % 2 != 0) {
        throw ecokv::error("model shape: need n_embd % n_head == 0, n_head % n_kv_heads == 0 and an even head_dim");
    }
    return o;
}

ggml_type weight_type(const std::string & name) {
    if (name == "q8_0") {
        return GGML_TYPE_Q8_0;
    }
    if (name == "q4_0") {
        return GGML_TYPE_Q4_0;
    }
    if (name == "f16") {
        return GGML_TYPE_F16;
    }
    if (name == "f32") {
        return GGML_TYPE_F32;
    }
    throw ecokv::error("--wtype " + name + ": expected q8_0, q4_0, f16 or f32");
}

// ---- memory ----------------------------------------------------------------------------------------------------

// VmRSS / VmHWM of this process in KiB (Linux /proc/self/status); 0 when unavailable.
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

uint64_t rss_kib() { return status_kib("VmRSS"); }

uint64_t hwm_kib() { return status_kib("VmHWM"); }

// Resets the peak (VmHWM) to the current RSS: "5" > /proc/self/clear_refs (Linux >= 4.0). Returns false when the
// kernel refuses; the phase peaks are then peaks since the start of the process.
bool reset_peak() {
    std::ofstream out("/proc/self/clear_refs");
    out << "5";
    out.flush();
    return bool(out);
}

double mib(uint64_t bytes) { return double(bytes) / 1048576.0; }

double kib_to_mib(uint64_t kib) { return double(kib) / 1024.0; }

// A phase: wall time, RSS at its end, peak RSS during it (HWM reset at its start).
struct phase {
    std::string name;
    double      seconds  = 0;
    uint64_t    rss_kib  = 0;
    uint64_t    peak_kib = 0;
};

struct phase_meter {
    bool               hwm_reset_works = true;
    std::vector<phase> phases;
    clock_type::time_point t0;
    std::string        name;

    void begin(std::string n) {
        name = std::move(n);
        hwm_reset_works = reset_peak() && hwm_reset_works;
        t0 = clock_type::now();
    }

    phase end() {
        phase p{ name, seconds_since(t0), rss_kib(), hwm_kib() };
        phases.push_back(p);
        return p;
    }
};

// ---- progress --------------------------------------------------------------------------------------------------

bool    g_verbose        = false;
int32_t g_threads        = 2;
double  g_last_cpu_share = 0;  // CPU seconds / (wall seconds x threads) of the last timed_decode

void log_filter(ggml_log_level level, const char * text, void *) {
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

template <typename... A> void progress(const char * fmt, A... args) {
    std::fprintf(stderr, fmt, args...);
    std::fflush(stderr);
}

// ---- the model -------------------------------------------------------------------------------------------------

using ecokv::test::fnv1a;
using ecokv::test::splitmix64;


bool ends_with(const std::string & s, const std::string & suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string & s, const std::string & prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

std::string layer_suffix(const std::string & name) {
    if (!starts_with(name, "blk.")) {
        return name;
    }
    const size_t dot = name.find('.', 4);
    return dot == std::string::npos ? name : name.substr(dot + 1);
}

// The initialisation of tests/llama/tiny-model.cpp (so attention is peaked, not uniform): embeddings N(0, 1),
// attn_q/attn_k N(0, 1.3/sqrt(fan_in)), other matrices N(0, 1/sqrt(fan_in)), norms 1 + N(0, 0.1), qwen2vl Q/K/V
// biases N(0, 0.2), other biases 0, every *.scale / rope_freqs 1 (llama.cpp creates these optional tensors for a
// model built from user data; 1 and 0 make them neutral).
enum class init_kind { normal, norm, one, zero, unknown };

struct init_rule {
    init_kind kind  = init_kind::unknown;
    double    stdev = 0;
};

init_rule rule_for(const std::string & name, int64_t fan_in, bool qwen2vl) {
    const std::string s = layer_suffix(name);
    if (ends_with(s, ".scale") || ends_with(s, ".input_scale") || starts_with(s, "rope_freqs") ||
        starts_with(s, "rope_factors")) {
        return { init_kind::one };
    }
    if (s == "token_embd.weight") {
        return { init_kind::normal, 1.0 };
    }
    if (s == "output_norm.weight" || s == "attn_norm.weight" || s == "ffn_norm.weight") {
        return { init_kind::norm, 0.1 };
    }
    if (s == "attn_q.weight" || s == "attn_k.weight") {
        return { init_kind::normal, 1.3 / std::sqrt(double(fan_in)) };
    }
    if (s == "output.weight" || s == "attn_v.weight" || s == "attn_output.weight" || s == "ffn_gate.weight" ||
        s == "ffn_up.weight" || s == "ffn_down.weight") {
        return { init_kind::normal, 1.0 / std::sqrt(double(fan_in)) };
    }
    if (s == "attn_q.bias" || s == "attn_k.bias" || s == "attn_v.bias") {
        return qwen2vl ? init_rule{ init_kind::normal, 0.2 } : init_rule{ init_kind::zero };
    }
    if (ends_with(s, ".bias")) {
        return { init_kind::zero };
    }
    return { init_kind::unknown };
}

struct builder {
    const options *          opt = nullptr;
    int64_t                  bytes_total = 0, bytes_done = 0;
    int64_t                  n_params = 0, n_bytes = 0;  // every tensor llama.cpp created
    int                      last_pct = -1;
    std::vector<std::string> unknown;
    std::vector<std::string> failed;
};

// Fills one tensor: rows of F32 values (one RNG stream per row, so threads do not change the values), converted to
// the tensor's type (ggml_quantize_chunk for Q8_0/Q4_0), block by block so no full-size F32 copy is ever held.
void set_tensor_data(ggml_tensor * t, void * ud) {
    builder &         b       = *static_cast<builder *>(ud);
    const std::string name    = ggml_get_name(t);
    const int64_t     n_row   = t->ne[0];
    const int64_t     n_rows  = ggml_nrows(t);
    const init_rule   r       = rule_for(name, n_row, b.opt->arch == "qwen2vl");
    const uint64_t    seed    = b.opt->seed ^ fnv1a(name);
    const size_t      row_sz  = ggml_row_size(t->type, n_row);
    const bool        quant   = ggml_is_quantized(t->type);
    if (r.kind == init_kind::unknown) {
        b.unknown.push_back(name);
    }
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && !quant) {
        b.failed.push_back(name + " (type " + ggml_type_name(t->type) + ")");
        return;
    }
    if (quant && n_row % ggml_blck_size(t->type) != 0) {
        b.failed.push_back(name + " (row not a multiple of the block)");
        return;
    }

    const int64_t block    = 64;  // rows per work item
    const int64_t n_blocks = (n_rows + block - 1) / block;
    const int     nth      = std::max(1, std::min<int>(b.opt->threads, int(n_blocks)));
    auto work = [&](int ith) {
        std::vector<float>   f(size_t(block * n_row));
        std::vector<uint8_t> q(size_t(block) * row_sz);
        for (int64_t ib = ith; ib < n_blocks; ib += nth) {
            const int64_t r0 = ib * block, nr = std::min(block, n_rows - r0);
            for (int64_t ir = 0; ir < nr; ++ir) {
                splitmix64 rng{ seed ^ (uint64_t(r0 + ir) * 0xd1b54a32d192ed03ull) };
                float *    row = f.data() + ir * n_row;
                for (int64_t i = 0; i < n_row; i += 2) {  // Box-Muller, both values
                    double z0 = 0, z1 = 0;
                    if (r.kind == init_kind::normal || r.kind == init_kind::norm) {
                        const double u1 = rng.uniform(), u2 = rng.uniform();
                        const double rad = std::sqrt(-2.0 * std::log(u1));
                        z0 = rad * std::cos(6.283185307179586 * u2);
                        z1 = rad * std::sin(6.283185307179586 * u2);
                    }
                    for (int64_t k = 0; k < 2 && i + k < n_row; ++k) {
                        const double z = k == 0 ? z0 : z1;
                        float        v = 0;
                        switch (r.kind) {
                            case init_kind::normal: v = float(r.stdev * z); break;
                            case init_kind::norm: v = float(1.0 + r.stdev * z); break;
                            case init_kind::one: v = 1.0f; break;
                            case init_kind::zero:
                            case init_kind::unknown: v = 0.0f; break;
                        }
                        row[i + k] = v;
                    }
                }
            }
            const void * src = f.data();
            if (quant) {
                ggml_quantize_chunk(t->type, f.data(), q.data(), 0, nr, n_row, nullptr);
                src = q.data();
            } else if (t->type == GGML_TYPE_F16) {
                ggml_fp32_to_fp16_row(f.data(), reinterpret_cast<ggml_fp16_t *>(q.data()), nr * n_row);
                src = q.data();
            }
            ggml_backend_tensor_set(t, src, size_t(r0) * row_sz, size_t(nr) * row_sz);
        }
    };
    std::vector<std::thread> pool;
    for (int ith = 1; ith < nth; ++ith) {
        pool.emplace_back(work, ith);
    }
    work(0);
    for (auto & th : pool) {
        th.join();
    }

    b.bytes_done += int64_t(ggml_nbytes(t));
    b.n_params += ggml_nelements(t);
    b.n_bytes += int64_t(ggml_nbytes(t));
    const int pct = b.bytes_total > 0 ? int(100 * b.bytes_done / b.bytes_total) : 100;
    if (pct / 10 != b.last_pct / 10) {
        progress("  weights %3d%%\n", std::min(pct, 100));
        b.last_pct = pct;
    }
}

struct gguf_deleter {
    void operator()(gguf_context * c) const { gguf_free(c); }
};

struct model_deleter {
    void operator()(llama_model * m) const { llama_model_free(m); }
};

using model_ptr = std::unique_ptr<llama_model, model_deleter>;

// Declares a weight in the metadata: a model built from user data takes each tensor's type from the gguf context
// (src/llama-model-loader.cpp, create_tensor with no files), F32 when it is not declared.
void declare(gguf_context * g, const std::string & name, int64_t ne0, int64_t ne1, ggml_type type) {
    ggml_tensor t;
    std::memset(&t, 0, sizeof t);
    t.type  = type;
    t.ne[0] = ne0, t.ne[1] = ne1, t.ne[2] = 1, t.ne[3] = 1;
    t.nb[0] = ggml_type_size(type);
    t.nb[1] = ggml_row_size(type, ne0);
    t.nb[2] = t.nb[3] = t.nb[1] * size_t(ne1);
    ggml_set_name(&t, name.c_str());
    gguf_add_tensor(g, &t);
}

struct model_info {
    int64_t n_params = 0;
    uint64_t weight_bytes = 0;
    int64_t n_quantized = 0;  // matrices stored in the quantized type
};

model_ptr build_model(const options & o, model_info & info) {
    const ggml_type wt = weight_type(o.wtype);
    const int32_t   hd = o.n_embd / o.n_head;
    std::unique_ptr<gguf_context, gguf_deleter> g(gguf_init_empty());
    const std::string a = o.arch;
    auto k = [&](const char * key) { return a + "." + key; };
    gguf_set_val_str(g.get(), "general.architecture", a.c_str());
    gguf_set_val_str(g.get(), "general.name", ("ecokv-bench-" + a).c_str());
    gguf_set_val_u32(g.get(), k("vocab_size").c_str(), uint32_t(o.n_vocab));
    gguf_set_val_u32(g.get(), k("context_length").c_str(), 32768u);
    gguf_set_val_u32(g.get(), k("embedding_length").c_str(), uint32_t(o.n_embd));
    gguf_set_val_u32(g.get(), k("block_count").c_str(), uint32_t(o.n_layer));
    gguf_set_val_u32(g.get(), k("feed_forward_length").c_str(), uint32_t(o.n_ff));
    gguf_set_val_u32(g.get(), k("attention.head_count").c_str(), uint32_t(o.n_head));
    gguf_set_val_u32(g.get(), k("attention.head_count_kv").c_str(), uint32_t(o.n_head_kv));
    gguf_set_val_f32(g.get(), k("attention.layer_norm_rms_epsilon").c_str(), 1e-6f);
    gguf_set_val_f32(g.get(), k("rope.freq_base").c_str(), 1000000.0f);
    if (o.arch == "qwen2vl") {
        // Qwen2-VL mrope_section [16, 24, 24] (pairs; sums to head_dim/2 = 64 at head_dim 128), scaled otherwise
        const int32_t half = hd / 2;
        const int32_t t = half / 4, y = (half - t) / 2, x = half - t - y;
        const std::array<int32_t, 4> sections = { t, y, x, 0 };
        gguf_set_arr_data(g.get(), k("rope.dimension_sections").c_str(), GGUF_TYPE_INT32, sections.data(), 4);
    }
    // dummy "test" tokenizer (upstream tests/test-llama-archs.cpp): token ids are fed directly
    std::vector<std::string>  words(size_t(o.n_vocab));
    std::vector<const char *> ptrs(size_t(o.n_vocab));
    std::vector<float>        scores(size_t(o.n_vocab), 0.0f);
    for (int32_t i = 0; i < o.n_vocab; ++i) {
        words[size_t(i)] = "tok_" + std::to_string(i);
        ptrs[size_t(i)]  = words[size_t(i)].c_str();
    }
    gguf_set_val_str(g.get(), "tokenizer.ggml.model", "test");
    gguf_set_arr_str(g.get(), "tokenizer.ggml.tokens", ptrs.data(), ptrs.size());
    gguf_set_arr_data(g.get(), "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(), scores.size());

    // every matrix in the chosen type (as a Q8_0 / Q4_0 GGUF of the real model); norms, biases, scales stay F32
    const int64_t n_kv = int64_t(o.n_head_kv) * hd;
    auto add = [&](const std::string & name, int64_t ne0, int64_t ne1) {
        const bool ok = !ggml_is_quantized(wt) || ne0 % ggml_blck_size(wt) == 0;
        declare(g.get(), name, ne0, ne1, ok ? wt : GGML_TYPE_F32);
        info.n_quantized += ok ? 1 : 0;
    };
    add("token_embd.weight", o.n_embd, o.n_vocab);
    add("output.weight", o.n_embd, o.n_vocab);
    for (int32_t il = 0; il < o.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        add(p + "attn_q.weight", o.n_embd, o.n_embd);
        add(p + "attn_k.weight", o.n_embd, n_kv);
        add(p + "attn_v.weight", o.n_embd, n_kv);
        add(p + "attn_output.weight", o.n_embd, o.n_embd);
        add(p + "ffn_gate.weight", o.n_embd, o.n_ff);
        add(p + "ffn_up.weight", o.n_embd, o.n_ff);
        add(p + "ffn_down.weight", o.n_ff, o.n_embd);
    }
    for (int64_t i = 0; i < gguf_get_n_tensors(g.get()); ++i) {
        info.weight_bytes += gguf_get_tensor_size(g.get(), i);
    }

    builder b;
    b.opt         = &o;
    b.bytes_total = int64_t(info.weight_bytes);
    llama_model_params params = llama_model_default_params();
    params.n_gpu_layers       = 0;
    params.progress_callback  = [](float, void *) { return true; };
    model_ptr m(llama_model_init_from_user(g.get(), set_tensor_data, &b, params));
    if (!m) {
        throw ecokv::error("llama_model_init_from_user failed (arch " + o.arch + ", weights " + o.wtype + ")");
    }
    if (!b.unknown.empty() || !b.failed.empty()) {
        std::string msg = "llama.cpp created tensors this bench cannot initialise:";
        for (const auto & n : b.unknown) {
            msg += " " + n;
        }
        for (const auto & n : b.failed) {
            msg += " " + n;
        }
        throw ecokv::error(msg);
    }
    info.n_params     = b.n_params;  // llama_model_n_params/size report 0 for a model built from user data
    info.weight_bytes = uint64_t(b.n_bytes);
    return m;
}

// ---- decoding --------------------------------------------------------------------------------------------------

std::vector<llama_token> random_tokens(int32_t n, int32_t n_vocab, uint64_t seed) {
    splitmix64               rng{ seed * 0x9e3779b97f4a7c15ull + 12345 };
    std::vector<llama_token> out(static_cast<size_t>(n));
    for (auto & t : out) {
        t = llama_token(rng.next() % uint64_t(n_vocab));
    }
    return out;
}

// Prefill in micro-batches with progress on stderr; returns the logits after the last token.
std::vector<float> prefill(llama_context * ctx, const std::vector<llama_token> & tokens, int32_t chunk,
                           bool show_progress) {
    const auto         t0 = clock_type::now();
    std::vector<float> logits;
    for (size_t first = 0; first < tokens.size(); first += size_t(chunk)) {
        const size_t n = std::min(tokens.size() - first, size_t(chunk));
        logits = el::decode(ctx, std::vector<llama_token>(tokens.begin() + std::ptrdiff_t(first),
                                                           tokens.begin() + std::ptrdiff_t(first + n)),
                            llama_pos(first));
        if (show_progress) {
            const double s = seconds_since(t0), done = double(first + n) / double(tokens.size());
            progress("  prefill %6zu / %zu tokens, %7.1f s elapsed, ~%.0f s left\n", first + n, tokens.size(), s,
                     s / done - s);
        }
    }
    return logits;
}

// CPU seconds (user + system) this process has used: with the wall time of a run it tells whether the run had
// its threads' worth of CPU (another process on the 2 cores makes ggml's spinning threads wait for each other).
double cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// One warm-up token at `pos` (removed again), then n greedy single-token decodes from pos. Returns the seconds of
// each step (llama_decode of one token + argmax over the vocabulary); the decoded tokens are removed afterwards.
std::vector<double> timed_decode(llama_context * ctx, const std::vector<float> & first_logits, llama_pos pos,
                                 int32_t n) {
    llama_token tok = el::argmax(first_logits);
    el::decode(ctx, { tok }, pos);
    if (!llama_memory_seq_rm(llama_get_memory(ctx), 0, pos, -1)) {
        throw ecokv::error("cannot remove the warm-up token");
    }
    std::vector<double> steps;
    const double        cpu0 = cpu_seconds();
    const auto          w0   = clock_type::now();
    for (int32_t i = 0; i < n; ++i) {
        const auto t0 = clock_type::now();
        tok           = el::argmax(el::decode(ctx, { tok }, pos + i));
        steps.push_back(seconds_since(t0));
    }
    g_last_cpu_share = (cpu_seconds() - cpu0) / (seconds_since(w0) * double(g_threads));
    if (!llama_memory_seq_rm(llama_get_memory(ctx), 0, pos, -1)) {
        throw ecokv::error("cannot remove the decoded tokens");
    }
    return steps;
}

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

uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

// ---- one configuration -----------------------------------------------------------------------------------------

struct config_result {
    std::string method;  // canonical
    std::string label;   // as given
    int32_t     budget = 0, window = 0, n_cells = 0;
    bool        uniform = true;
    uint64_t    kv_alloc = 0, kv_kept = 0, n_ctx = 0;
    double      select_s = 0, rebuild_s = 0;
    uint64_t    compress_peak_kib = 0, compress_rss_kib = 0;
    std::vector<uint8_t> state;
    std::vector<float>   bias;
    std::vector<double>  decode_s, base_decode_s;          // per run
    std::vector<double>  decode_steps, base_decode_steps;  // per token, all runs
    std::vector<double>  cpu_share, base_cpu_share;        // per run
    double               base_prefill_s = 0;
    uint64_t             decode_peak_kib = 0, base_peak_kib = 0;
};

el::context_ptr new_context(llama_model * model, llama_context_params cparams, uint32_t n_ctx) {
    cparams.n_ctx = n_ctx;
    el::context_ptr ctx(llama_init_from_model(model, cparams));
    if (!ctx) {
        throw ecokv::error("cannot create a context of " + std::to_string(n_ctx) + " cells");
    }
    return ctx;
}

// The compressed decode context, as compress_context() builds it: n_cells + n_decode cells, the compacted state,
// the per-head padding bias for non-uniform budgets.
el::context_ptr restore_compressed(llama_model * model, llama_context_params cparams, const config_result & c,
                                   int32_t n_decode) {
    el::context_ptr ctx = new_context(model, cparams, uint32_t(c.n_cells + n_decode));
    if (llama_state_seq_set_data(ctx.get(), c.state.data(), c.state.size(), 0) != c.state.size()) {
        throw ecokv::error("llama.cpp rejected the compacted state of " + c.method);
    }
    if (!c.bias.empty() && !llama_set_kv_head_bias(ctx.get(), c.bias.data(), uint32_t(c.n_cells))) {
        throw ecokv::error("cannot set the per-head bias");
    }
    return ctx;
}

std::string fmt(const char * f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

int run(int argc, char ** argv) {
    const options o = parse(argc, argv);
    g_verbose       = o.verbose;
    g_threads       = o.threads;
    llama_log_set(log_filter, nullptr);
    llama_backend_init();

    std::vector<ecokv::method_spec> specs;
    int32_t                         n_queries = 32;
    bool                            full_q    = false;
    for (const auto & m : o.methods) {
        specs.push_back(ecokv::parse_method(m));
        for (int32_t b : o.budgets) {
            ecokv::method_params p;
            p.budget = b;
            p.validate(ecokv::method_window(specs.back(), p));
        }
        ecokv::method_params p;
        n_queries = std::max(n_queries, ecokv::method_window(specs.back(), p));
        full_q    = full_q || specs.back().scorer == "h2o";
    }
    if (o.n_tokens + o.n_decode > 32768) {
        throw ecokv::error("--tokens + --n-decode must fit the model's 32768-token context");
    }

    phase_meter pm;
    const auto  t_all = clock_type::now();

    // 1. model
    progress("[1/6] building a random-weight %s model in memory: %d layers, n_embd %d, %d/%d heads, n_ff %d, "
             "vocab %d, %s weights\n",
             o.arch.c_str(), o.n_layer, o.n_embd, o.n_head, o.n_head_kv, o.n_ff, o.n_vocab, o.wtype.c_str());
    pm.begin("build model");
    model_info minfo;
    model_ptr  model = build_model(o, minfo);
    const phase ph_model = pm.end();
    progress("  %.2f B parameters, %.0f MiB of weights, %.1f s, RSS %.0f MiB\n", double(minfo.n_params) / 1e9,
             mib(minfo.weight_bytes), ph_model.seconds, kib_to_mib(ph_model.rss_kib));

    llama_context_params cparams = llama_context_default_params();
    cparams.n_batch              = uint32_t(o.n_ubatch);
    cparams.n_ubatch             = uint32_t(o.n_ubatch);
    cparams.n_seq_max            = 1;
    cparams.n_threads = cparams.n_threads_batch = o.threads;
    cparams.flash_attn_type = o.flash_attn == "on"    ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                              : o.flash_attn == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                      : LLAMA_FLASH_ATTN_TYPE_AUTO;

    // 2. prefill with the query capture
    progress("[2/6] prefill of %d random tokens (%d threads, ubatch %d)\n", o.n_tokens, o.threads, o.n_ubatch);
    const std::vector<llama_token> prompt = random_tokens(o.n_tokens, o.n_vocab, o.seed);
    auto capture = std::make_unique<el::query_capture>(model.get(), n_queries, full_q);
    pm.begin("prefill (context + decode of the prompt)");
    llama_context_params prefill_params = cparams;
    capture->attach(prefill_params);
    el::context_ptr ctx_full = new_context(model.get(), prefill_params, uint32_t(o.n_tokens + o.n_decode));
    const auto      t_pf     = clock_type::now();
    const double    cpu_pf   = cpu_seconds();
    const std::vector<float> first_logits = prefill(ctx_full.get(), prompt, o.n_ubatch, true);
    const double    prefill_s = seconds_since(t_pf);
    const double    prefill_cpu_share = (cpu_seconds() - cpu_pf) / (prefill_s * o.threads);
    capture->set_active(false);
    const phase ph_prefill = pm.end();
    progress("  prefill %.1f s (%.1f tok/s, CPU share %.2f), RSS %.0f MiB, peak %.0f MiB\n", prefill_s,
             o.n_tokens / prefill_s, prefill_cpu_share, kib_to_mib(ph_prefill.rss_kib), kib_to_mib(ph_prefill.peak_kib));

    // 3. full-cache decode
    progress("[3/6] decode %d tokens from the full cache (%d repeats)\n", o.n_decode, o.repeats);
    pm.begin("decode, full cache");
    std::vector<double> full_decode_s, full_cpu_share;
    for (int32_t r = 0; r < o.repeats; ++r) {
        full_decode_s.push_back(sum(timed_decode(ctx_full.get(), first_logits, o.n_tokens, o.n_decode)));
        full_cpu_share.push_back(g_last_cpu_share);
        progress("  repeat %d: %.2f s (%.2f tok/s, CPU share %.2f)\n", r + 1, full_decode_s.back(),
                 o.n_decode / full_decode_s.back(), g_last_cpu_share);
    }
    const phase ph_full_decode = pm.end();

    // 4. read the cache (prefill_state copies the sequence state), then free the prefill context
    progress("[4/6] reading the prefill cache (llama_state_seq_get_data)\n");
    pm.begin("read state (prefill context + state copy)");
    auto state = std::make_unique<el::prefill_state>(ctx_full.get(), *capture, std::vector<uint8_t>{});
    const uint64_t bytes_per_cell = state->kv_bytes_per_cell();
    const uint64_t kv_full_alloc  = el::kv_bytes_allocated(ctx_full.get(), bytes_per_cell);
    const uint32_t n_ctx_full     = llama_n_ctx(ctx_full.get());
    const phase    ph_read        = pm.end();
    ctx_full.reset();

    // 5. compress each configuration (decode contexts are rebuilt in step 6, so only one is alive at a time)
    progress("[5/6] compressing: %zu method(s) x %zu budget(s)\n", specs.size(), o.budgets.size());
    std::vector<config_result> results;
    std::vector<phase>         compress_phases;
    for (size_t mi = 0; mi < specs.size(); ++mi) {
        for (int32_t budget : o.budgets) {
            ecokv::method_params p;
            p.budget = budget;
            config_result c;
            c.label  = o.methods[mi];
            c.budget = budget;
            pm.begin("compress " + o.methods[mi] + " B=" + std::to_string(budget));
            el::compressed_cache cc = el::compress_context(model.get(), *state, specs[mi], p, o.n_decode, cparams);
            const phase ph = pm.end();
            c.method            = cc.sel.method;
            c.window            = cc.sel.window;
            c.n_cells           = cc.n_cells;
            c.uniform           = cc.bias.empty();
            c.kv_alloc          = cc.kv_bytes_alloc;
            c.kv_kept           = cc.kv_bytes_kept;
            c.n_ctx             = llama_n_ctx(cc.ctx.get());
            c.select_s          = cc.select_seconds;
            c.rebuild_s         = cc.rebuild_seconds;
            c.compress_peak_kib = ph.peak_kib;
            c.compress_rss_kib  = ph.rss_kib;
            c.state             = std::move(cc.state);
            c.bias              = std::move(cc.bias);
            progress("  %-18s B=%-4d select %.3f s, rebuild %.3f s, %d cells/head, KV %.2f MiB allocated\n",
                     c.method.c_str(), budget, c.select_s, c.rebuild_s, c.n_cells, mib(c.kv_alloc));
            results.push_back(std::move(c));
        }
    }
    state.reset();
    capture.reset();

    // 6. decode: compressed vs uncompressed of the same length, interleaved, alternating which goes first
    progress("[6/6] decode %d tokens: compressed vs an uncompressed context of the same length (%d repeats)\n",
             o.n_decode, o.repeats);
    pm.begin("idle after freeing the prefill context and state");
    const phase ph_idle = pm.end();
    for (int32_t r = 0; r < o.repeats; ++r) {
        for (auto & c : results) {
            for (int k = 0; k < 2; ++k) {
                const bool compressed = (k == 0) == (r % 2 == 0);
                reset_peak();
                if (compressed) {
                    el::context_ptr ctx = restore_compressed(model.get(), cparams, c, o.n_decode);
                    const auto steps = timed_decode(ctx.get(), first_logits, o.n_tokens, o.n_decode);
                    c.decode_s.push_back(sum(steps));
                    c.decode_steps.insert(c.decode_steps.end(), steps.begin(), steps.end());
                    c.cpu_share.push_back(g_last_cpu_share);
                    c.decode_peak_kib = std::max(c.decode_peak_kib, hwm_kib());
                } else {
                    el::context_ptr ctx  = new_context(model.get(), cparams, uint32_t(c.n_cells + o.n_decode));
                    const auto      tb   = clock_type::now();
                    const auto      lg   = prefill(ctx.get(), random_tokens(c.n_cells, o.n_vocab, o.seed + 7),
                                                   o.n_ubatch, false);
                    c.base_prefill_s     = seconds_since(tb);
                    const auto steps     = timed_decode(ctx.get(), lg, c.n_cells, o.n_decode);
                    c.base_decode_s.push_back(sum(steps));
                    c.base_decode_steps.insert(c.base_decode_steps.end(), steps.begin(), steps.end());
                    c.base_cpu_share.push_back(g_last_cpu_share);
                    c.base_peak_kib = std::max(c.base_peak_kib, hwm_kib());
                }
            }
            progress("  repeat %d %-18s B=%-4d compressed %.2f tok/s (CPU share %.2f), uncompressed (%d tokens) %.2f "
                     "tok/s (CPU share %.2f)\n",
                     r + 1, c.method.c_str(), c.budget, o.n_decode / c.decode_s.back(), c.cpu_share.back(), c.n_cells,
                     o.n_decode / c.base_decode_s.back(), c.base_cpu_share.back());
        }
    }
    const double total_s = seconds_since(t_all);

    // ---- report ----
    // Decode speed: the best of the repeats (the machine's other load only ever adds time); the median run and the
    // per-token medians are in the JSON and in the target lines.
    const double full_dec = min_of(full_decode_s);
    nlohmann::json rows   = nlohmann::json::array();
    const uint64_t pipeline_common = std::max(ph_prefill.peak_kib, ph_read.peak_kib);
    rows.push_back({
        { "method", "FullKV" }, { "budget", nullptr }, { "cells_per_head", o.n_tokens }, { "n_ctx", n_ctx_full },
        { "kv_bytes_allocated", kv_full_alloc }, { "kv_bytes_kept", bytes_per_cell * uint64_t(o.n_tokens) },
        { "peak_rss_decode_kib", ph_full_decode.peak_kib },
        { "peak_rss_pipeline_kib", std::max(ph_prefill.peak_kib, ph_full_decode.peak_kib) },
        { "prefill_s", prefill_s }, { "prefill_cpu_share", prefill_cpu_share }, { "compress_s", 0.0 },
        { "select_s", 0.0 }, { "rebuild_s", 0.0 },
        { "decode_s", full_dec }, { "decode_s_all", full_decode_s }, { "decode_s_median", median(full_decode_s) },
        { "cpu_share_all", full_cpu_share },
        { "decode_tokens_per_s", o.n_decode / full_dec },
    });
    nlohmann::json targets = nlohmann::json::array();
    for (const auto & c : results) {
        const double   dec      = min_of(c.decode_s);
        const double   base     = min_of(c.base_decode_s);
        const double   med_ratio = median(c.base_decode_s) / median(c.decode_s);
        const double   tps      = o.n_decode / dec, base_tps = o.n_decode / base;
        const double   comp     = c.select_s + c.rebuild_s;
        const uint64_t bound    = round_up(uint64_t(c.n_cells + o.n_decode), 256) * bytes_per_cell;
        const uint64_t kept_cells = (c.kv_kept + bytes_per_cell - 1) / bytes_per_cell;  // mean kept cells per head
        const uint64_t bound_kept = round_up(kept_cells + uint64_t(o.n_decode), 256) * bytes_per_cell;
        rows.push_back({
            { "method", c.method }, { "budget", c.budget }, { "window", c.window }, { "cells_per_head", c.n_cells },
            { "uniform", c.uniform }, { "n_ctx", c.n_ctx }, { "kv_bytes_allocated", c.kv_alloc },
            { "kv_bytes_kept", c.kv_kept }, { "kv_bytes_bound", bound }, { "kv_bytes_bound_kept_entries", bound_kept },
            { "peak_rss_decode_kib", c.decode_peak_kib },
            { "peak_rss_pipeline_kib", std::max({ pipeline_common, c.compress_peak_kib, c.decode_peak_kib }) },
            { "peak_rss_compress_kib", c.compress_peak_kib }, { "prefill_s", prefill_s }, { "compress_s", comp },
            { "select_s", c.select_s }, { "rebuild_s", c.rebuild_s }, { "compress_over_prefill", comp / prefill_s },
            { "decode_s", dec }, { "decode_s_all", c.decode_s }, { "decode_tokens_per_s", tps },
            { "decode_s_median", median(c.decode_s) }, { "uncompressed_decode_s_median", median(c.base_decode_s) },
            { "decode_speed_ratio_median_run", med_ratio }, { "cpu_share_all", c.cpu_share },
            { "uncompressed_cpu_share_all", c.base_cpu_share },
            { "uncompressed_prefill_s", c.base_prefill_s }, { "uncompressed_decode_s", base },
            { "uncompressed_decode_s_all", c.base_decode_s }, { "uncompressed_decode_tokens_per_s", base_tps },
            { "uncompressed_peak_rss_kib", c.base_peak_kib }, { "decode_speed_ratio", tps / base_tps },
            { "decode_step_median_s", median(c.decode_steps) },
            { "uncompressed_decode_step_median_s", median(c.base_decode_steps) },
            { "decode_speed_ratio_step_median", median(c.base_decode_steps) / median(c.decode_steps) },
        });
        targets.push_back({
            { "method", c.method }, { "budget", c.budget },
            { "decode_within_5pct", tps >= 0.95 * base_tps }, { "decode_ratio", tps / base_tps },
            { "decode_ratio_step_median", median(c.base_decode_steps) / median(c.decode_steps) },
            { "decode_ratio_median_run", med_ratio },
            { "compress_under_2pct", comp < 0.02 * prefill_s }, { "compress_pct", 100 * comp / prefill_s },
            { "kv_alloc_within_bound", c.kv_alloc <= bound },
            { "kv_alloc_within_kept_entries_bound", c.kv_alloc <= bound_kept },
        });
    }
    nlohmann::json phases = nlohmann::json::array();
    for (const auto & ph : pm.phases) {
        phases.push_back({ { "phase", ph.name }, { "seconds", ph.seconds }, { "rss_kib", ph.rss_kib },
                           { "peak_kib", ph.peak_kib } });
    }
    nlohmann::json out = {
        { "model", { { "arch", o.arch }, { "n_layer", o.n_layer }, { "n_embd", o.n_embd }, { "n_head", o.n_head },
                     { "n_head_kv", o.n_head_kv }, { "head_dim", o.n_embd / o.n_head }, { "n_ff", o.n_ff },
                     { "n_vocab", o.n_vocab }, { "weights", o.wtype }, { "n_params", minfo.n_params },
                     { "weight_bytes", minfo.weight_bytes } } },
        { "tokens", o.n_tokens }, { "n_decode", o.n_decode }, { "repeats", o.repeats }, { "threads", o.threads },
        { "ubatch", o.n_ubatch }, { "flash_attn", o.flash_attn }, { "kv_bytes_per_cell", bytes_per_cell },
        { "peak_reset_works", pm.hwm_reset_works }, { "total_s", total_s },
        { "phases", phases }, { "rows", rows }, { "targets", targets },
    };
    (void) ph_idle;
    if (!o.json_file.empty()) {
        std::ofstream f(o.json_file);
        f << out.dump(1) << "\n";
        if (!f) {
            throw ecokv::error(o.json_file + ": cannot write");
        }
    }
    if (o.json) {
        std::printf("%s\n", out.dump(1).c_str());
        return 0;
    }

    std::printf("bench-decode: %s, %d layers, n_embd %d, %d/%d heads (head_dim %d), n_ff %d, vocab %d, %s weights "
                "(%.2f B params, %.0f MiB)\n",
                o.arch.c_str(), o.n_layer, o.n_embd, o.n_head, o.n_head_kv, o.n_embd / o.n_head, o.n_ff, o.n_vocab,
                o.wtype.c_str(), double(minfo.n_params) / 1e9, mib(minfo.weight_bytes));
    std::printf("prompt %d random tokens, decode %d tokens, %d threads, ubatch %d, flash attention %s, decode = best of "
                "%d repeats, F16 K/V (%.0f KiB per cell)\n\n",
                o.n_tokens, o.n_decode, o.threads, o.n_ubatch, o.flash_attn.c_str(), o.repeats,
                double(bytes_per_cell) / 1024);
    std::printf("%-22s %6s %6s %9s %8s %9s %9s %8s %12s %8s %8s %9s %7s\n", "Method", "Budget", "Cells", "KV alloc",
                "KV kept", "Peak RSS", "Peak RSS", "Prefill", "Compress", "Decode", "Decode", "Uncompr.", "Ratio");
    std::printf("%-22s %6s %6s %9s %8s %9s %9s %8s %12s %8s %8s %9s %7s\n", "", "", "/head", "MiB", "MiB", "decode",
                "pipeline", "s", "s (%pf)", "s", "tok/s", "tok/s", "");
    for (const auto & r : rows) {
        const bool full = r["method"] == "FullKV";
        std::printf("%-22s %6s %6d %9.2f %8.2f %9.0f %9.0f %8.1f %12s %8.2f %8.2f %9s %7s\n",
                    r["method"].get<std::string>().c_str(),
                    full ? "-" : std::to_string(r["budget"].get<int>()).c_str(), r["cells_per_head"].get<int>(),
                    mib(r["kv_bytes_allocated"].get<uint64_t>()), mib(r["kv_bytes_kept"].get<uint64_t>()),
                    kib_to_mib(r["peak_rss_decode_kib"].get<uint64_t>()),
                    kib_to_mib(r["peak_rss_pipeline_kib"].get<uint64_t>()), r["prefill_s"].get<double>(),
                    full ? "-"
                         : (fmt("%.3f", r["compress_s"].get<double>()) + " (" +
                            fmt("%.2f", 100 * r["compress_over_prefill"].get<double>()) + ")")
                               .c_str(),
                    r["decode_s"].get<double>(), r["decode_tokens_per_s"].get<double>(),
                    full ? "-" : fmt("%.2f", r["uncompressed_decode_tokens_per_s"].get<double>()).c_str(),
                    full ? "-" : fmt("%.3f", r["decode_speed_ratio"].get<double>()).c_str());
    }
    std::printf("\nCPU share (CPU seconds / (wall x %d threads); below ~0.95 another process took the cores): prefill "
                "%.2f, decode runs min %.2f\n",
                o.threads, prefill_cpu_share, [&] {
                    double m = min_of(full_cpu_share);
                    for (const auto & c : results) {
                        m = std::min({ m, min_of(c.cpu_share), min_of(c.base_cpu_share) });
                    }
                    return m;
                }());
    std::printf("\nRSS by phase (peak = VmHWM reset at the phase start%s):\n",
                pm.hwm_reset_works ? "" : "; reset FAILED, peaks are since process start");
    for (const auto & ph : pm.phases) {
        if (ph.name.rfind("idle", 0) == 0) {
            std::printf("  %-52s RSS %7.0f MiB\n", ph.name.c_str(), kib_to_mib(ph.rss_kib));
            continue;
        }
        std::printf("  %-52s %8.2f s  RSS %7.0f MiB  peak %7.0f MiB\n", ph.name.c_str(), ph.seconds,
                    kib_to_mib(ph.rss_kib), kib_to_mib(ph.peak_kib));
    }
    std::printf("\nTargets:\n");
    for (size_t i = 0; i < results.size(); ++i) {
        const auto & c = results[i];
        const auto & r = rows[i + 1];
        const auto & t = targets[i];
        std::printf("  %-18s B=%-4d decode %.2f vs %.2f tok/s uncompressed: ratio %.3f %s (median runs %.3f, per-token "
                    "medians %.3f) | compress %.3f s = %.2f%% "
                    "of prefill %s | KV %.2f MiB <= %.2f MiB bound %s%s\n",
                    c.method.c_str(), c.budget, r["decode_tokens_per_s"].get<double>(),
                    r["uncompressed_decode_tokens_per_s"].get<double>(), t["decode_ratio"].get<double>(),
                    t["decode_within_5pct"].get<bool>() ? "MET" : "NOT MET", t["decode_ratio_median_run"].get<double>(),
                    t["decode_ratio_step_median"].get<double>(),
                    r["compress_s"].get<double>(),
                    t["compress_pct"].get<double>(), t["compress_under_2pct"].get<bool>() ? "MET" : "NOT MET",
                    mib(c.kv_alloc), mib(r["kv_bytes_bound"].get<uint64_t>()),
                    t["kv_alloc_within_bound"].get<bool>() ? "MET" : "NOT MET",
                    c.uniform ? ""
                              : (t["kv_alloc_within_kept_entries_bound"].get<bool>()
                                     ? " (also within the kept-entries bound)"
                                     : (" (padded to the longest head: kept-entries bound " +
                                        fmt("%.2f", mib(r["kv_bytes_bound_kept_entries"].get<uint64_t>())) +
                                        " MiB NOT MET)"))
                                    .c_str());
    }
    std::printf("\ntotal %.0f s\n", total_s);
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "bench-decode: error: %s\n", e.what());
        return 1;
    }
}
