// What the llama.cpp benchmarks share: the random-weight model they build in memory (the tests' builder at bench
// scale) and its command-line options, random prompts, and the process's memory and CPU figures.
#pragma once

#include "common/engine-flags.h"
#include "ecokv/llama-session.h"

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ecokv::bench {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0);

// Progress on stderr, flushed.
__attribute__((format(printf, 1, 2))) void progress(const char * fmt, ...);

// An integer option in [lo, 1000000]; a string option among `allowed`. Throw ecokv::error naming the option.
int32_t     bounded(const cxxopts::ParseResult & args, const std::string & name, int32_t lo);
std::string one_of(const cxxopts::ParseResult & args, const std::string & name, const std::vector<std::string> & allowed);

// The engine options a bench starts from: 2 threads, logical and physical batches of 512.
llama::session_options bench_engine_defaults();

// The model and how it runs: Qwen2-VL-2B's text geometry with a reduced vocabulary by default.
// The engine options are ecokv's (ecokv/llama-options.h: --threads, -ub, -fa, -ctk, ...), at the bench's defaults:
// 2 threads, batches of 512; threads also fill the weights and run the ecokv core.
struct model_shape {
    std::string arch = "qwen2vl", wtype = "q8_0";
    int32_t     n_layer = 28, n_embd = 1536, n_head = 12, n_head_kv = 2, n_ff = 8960, n_vocab = 32768;
    int32_t     sliding_window = 512, swa_pattern = 6;  // gemma3: interleaved sliding-window attention (Gemma 3's 5:1)
    uint64_t    seed    = 1;
    llama::session_options engine = bench_engine_defaults();
    int32_t     threads = 2, n_ubatch = 512;  // engine's, for the reports
    std::string flash_attn = "auto";          // engine's, as the option spells it

    int32_t head_dim() const { return n_embd / n_head; }
};

constexpr int32_t k_n_ctx_train = 32768;  // the model's context (Qwen2-VL-2B)

// --wtype --arch --seed, the engine options (group "engine") and the group "model shape" (--layers --embd --heads
// --kv-heads --ff --vocab), with model_shape's defaults.
void        add_model_options(cxxopts::Options & spec);
model_shape read_model_options(const cxxopts::ParseResult & args);  // checked: whole heads, an even head_dim

// A bench's main: body()'s exit status, or 1 after "NAME: error: ..." on stderr (with "(see --help)" for a bad
// command line).
int run_main(const char * name, const std::function<int()> & body);

// What every bench prints and how: --json, --json-file, --verbose.
struct output_options {
    bool        json = false, verbose = false;
    std::string json_file;
};

// --json --json-file --verbose -h/--help and the model options, after the bench's own; then parses argv: nullopt
// after printing --help, an error for a stray positional argument.
std::optional<cxxopts::ParseResult> parse_bench_options(cxxopts::Options & spec, int argc, char ** argv);
output_options                      read_output_options(const cxxopts::ParseResult & args);

struct model_info {
    int64_t  n_params     = 0;
    uint64_t weight_bytes = 0;
};

// The tests' random-weight builder (tiny-model.h) at bench scale: matrices in shape.wtype, no F32 copy, filled on
// shape.threads threads, progress every 10%.
llama::model_ptr     build_model(const model_shape & shape, model_info & info);
// Device memory in use over the GPU devices (total - free, as ggml_backend_dev_memory reports it), or -1 without one.
int64_t              device_used_bytes();
nlohmann::json       model_json(const model_shape & shape, const model_info & info);
std::vector<llama_token> random_tokens(int32_t n, int32_t n_vocab, uint64_t seed);

// This process (Linux /proc/self/status): resident set and its peak (VmHWM) in KiB, 0 when unavailable.
uint64_t rss_kib();
uint64_t hwm_kib();
// Resets VmHWM to the current RSS ("5" > /proc/self/clear_refs, Linux >= 4.0); false when the kernel refuses.
bool     reset_peak();
// CPU seconds (user + system) used so far: with the wall time it tells whether a run had its threads' worth of CPU.
double   cpu_seconds();

// A phase: wall time, RSS at its end, peak RSS during it (VmHWM reset at its start).
struct phase {
    std::string name;
    double      seconds  = 0;
    uint64_t    rss_kib  = 0;
    uint64_t    peak_kib = 0;
};

// Phases one after the other; hwm_reset_works is false when a peak could not be reset (peaks are then since the
// start of the process).
struct phase_meter {
    bool                   hwm_reset_works = true;
    std::vector<phase>     phases;
    clock_type::time_point t0;
    std::string            name;

    void  begin(std::string n);
    phase end();
};

nlohmann::json phases_json(const std::vector<phase> & phases);

inline double mib(uint64_t bytes) { return double(bytes) / 1048576.0; }
inline double kib_to_mib(uint64_t kib) { return double(kib) / 1024.0; }

}  // namespace ecokv::bench
