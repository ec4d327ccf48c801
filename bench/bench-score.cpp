// Scoring + selection of one layer at Qwen2-VL-7B geometry (28 query heads, 4 KV heads, head_dim 128), against
// one pass that only reads that layer's K and V. Counter `x_read` is the method's time over the read pass's.
//   build/bin/bench-score [--benchmark_filter=ecokv] [--benchmark_format=json]
#include "ecokv/ecokv.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

namespace {

constexpr int32_t k_heads = 28, k_kv_heads = 4, k_head_dim = 128;

const ecokv::owned_capture & layer(int32_t n_tokens, ecokv::dtype type) {
    static std::map<std::pair<int32_t, int>, std::unique_ptr<ecokv::owned_capture>> cache;
    auto & slot = cache[{ n_tokens, int(type) }];
    if (!slot) {
        ecokv::synth_params p;
        p.n_layers = 1, p.n_heads = k_heads, p.n_kv_heads = k_kv_heads, p.head_dim = k_head_dim;
        p.n_tokens = n_tokens, p.n_queries = 32, p.type = type, p.seed = 1;
        p.image_spans = { { n_tokens / 16, n_tokens - n_tokens / 8 } };
        slot = std::make_unique<ecokv::owned_capture>(ecokv::make_synth_capture(p));
    }
    return *slot;
}

int32_t threads() { return int32_t(std::max(1u, std::thread::hardware_concurrency())); }

// Sums every 64-bit word of K and V, threaded over KV heads like the methods: the memory-bound floor.
uint64_t read_pass(const ecokv::capture_view & v) {
    std::vector<uint64_t> partial(size_t(v.n_kv_heads), 0);
    ecokv::kernels::parallel_for(v.n_kv_heads, threads(), [&](int64_t ig) {
        uint64_t acc = 0;
        for (const ecokv::tensor_view * t : { &v.layers[0].keys, &v.layers[0].values }) {
            const auto * p = static_cast<const uint64_t *>(t->row(0, ig));
            const size_t n = size_t(t->nb[2]) / sizeof(uint64_t);
#pragma omp simd reduction(+ : acc)
            for (size_t i = 0; i < n; ++i) {
                acc += p[i];
            }
        }
        partial[size_t(ig)] = acc;
    });
    uint64_t s = 0;
    for (uint64_t x : partial) {
        s += x;
    }
    return s;
}

double seconds_per_read(const ecokv::capture_view & v) {
    static std::map<const void *, double> cache;
    auto it = cache.find(&v);
    if (it != cache.end()) {
        return it->second;
    }
    double best = 1e30;
    for (int rep = 0; rep < 30; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        benchmark::DoNotOptimize(read_pass(v));
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return cache[&v] = best;
}

ecokv::dtype dtype_arg(int64_t a) { return a == 16 ? ecokv::dtype::f16 : ecokv::dtype::f32; }

void set_counters(benchmark::State & state, const ecokv::capture_view & v, double seconds_per_iter) {
    const double bytes = double(v.layers[0].keys.nb[3] + v.layers[0].values.nb[3]);
    state.counters["x_read"]   = seconds_per_iter / seconds_per_read(v);
    state.counters["read_GBs"] = bytes / seconds_per_read(v) / 1e9;
    state.counters["ns_token"] = seconds_per_iter * 1e9 / v.n_tokens;
}

void bm_read(benchmark::State & state) {
    const auto & v = layer(int32_t(state.range(0)), dtype_arg(state.range(1))).view();
    for (auto _ : state) {
        benchmark::DoNotOptimize(read_pass(v));
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * (v.layers[0].keys.nb[3] + v.layers[0].values.nb[3]));
    set_counters(state, v, seconds_per_read(v));
}

void bm_method(benchmark::State & state, const char * method) {
    const auto & v    = layer(int32_t(state.range(0)), dtype_arg(state.range(1))).view();
    const auto   spec = ecokv::parse_method(method);
    ecokv::method_params p;
    p.budget         = 256;
    double     total = 0;
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        benchmark::DoNotOptimize(ecokv::compress(v, spec, p, { threads() }));
        total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    set_counters(state, v, total / double(state.iterations()));
}

// Window attention alone (the FMA-bound part of every attention-based method): the compute floor.
void bm_attention(benchmark::State & state, int32_t n_window) {
    const auto &       v = layer(int32_t(state.range(0)), dtype_arg(state.range(1))).view();
    std::vector<std::vector<float>> a0(size_t(v.n_kv_heads), std::vector<float>(size_t(v.n_tokens - n_window)));
    double             total = 0;
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        ecokv::kernels::parallel_for(v.n_kv_heads, threads(),
                                     [&](int64_t ig) { ecokv::kernels::window_attention(v, 0, int32_t(ig), n_window, a0[ig]); });
        total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double seconds = total / double(state.iterations());
    set_counters(state, v, seconds);
    state.counters["GMACs"] = double(v.n_heads) * n_window * v.n_tokens * v.head_dim / seconds / 1e9;
}

void geometry(benchmark::internal::Benchmark * b) {
    for (int64_t type : { 16, 32 }) {
        for (int64_t t : { 2048, 8192, 32768 }) {
            b->Args({ t, type });
        }
    }
    b->ArgNames({ "T", "bits" })->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(bm_read)->Apply(geometry);
BENCHMARK_CAPTURE(bm_attention, window4, 4)->Apply(geometry);
BENCHMARK_CAPTURE(bm_attention, window32, 32)->Apply(geometry);
BENCHMARK_CAPTURE(bm_method, snapkv, "snapkv")->Apply(geometry);
BENCHMARK_CAPTURE(bm_method, mixkv, "mixkv")->Apply(geometry);
BENCHMARK_CAPTURE(bm_method, ecokv, "ecokv")->Apply(geometry);

}  // namespace

BENCHMARK_MAIN();
