// ecokv compress: apply a method to a capture file and write the selection JSON (SPEC §8).
#include "common/args.h"
#include "ecokv/capture.h"
#include "ecokv/compress.h"
#include "ecokv/error.h"

#include <chrono>
#include <cstdio>

namespace {

void print_methods() {
    std::printf("%-13s %-10s %-14s %s\n", "name", "kind", "default", "description");
    for (const ecokv::method_info & m : ecokv::list_methods()) {
        std::printf("%-13s %-10s %-14s %s\n", m.name.c_str(), m.kind.c_str(), m.defaults.c_str(),
                    m.description.c_str());
    }
    std::printf("\nCompose as ALLOCATOR+SCORER (e.g. pyramidkv+ecokv, adakv+mixkv); a bare scorer uses the uniform\n"
                "allocator, a bare allocator its paper's scorer; snapkv+SCORER = uniform+SCORER.\n");
}

}  // namespace

int ecokv_compress(int argc, char ** argv) {
    return ecokv::tools::run_command("compress", [&] {
        cxxopts::Options options("ecokv compress", "Select the KV entries each (layer, KV head) keeps.");
        // clang-format off
        options.add_options()
            ("i,input", "capture file (safetensors, SPEC §7)", cxxopts::value<std::string>())
            ("o,output", "selection JSON to write (SPEC §8)", cxxopts::value<std::string>())
            ("merged-output", "with --merge pivot: safetensors of the rewritten K/V rows", cxxopts::value<std::string>())
            ("t,threads", "threads (0: all cores)", cxxopts::value<int32_t>()->default_value("0"))
            ("list-methods", "list scorers and allocators, then exit")
            ("q,quiet", "print nothing on success")
            ("h,help", "show this help");
        // clang-format on
        ecokv::tools::add_compression_options(options, ecokv::scope_method, {}, {}, false);
        const auto parsed = ecokv::tools::parse_options(options, argc, argv);
        if (!parsed) {
            return 0;
        }
        const cxxopts::ParseResult & args = *parsed;
        if (args.count("list-methods")) {
            print_methods();
            return 0;
        }
        ecokv::tools::require(args, { "input", "method", "output" });
        const ecokv::compression     c      = ecokv::tools::compression_from(args);
        c.validate();  // fail on bad options before reading a large capture
        const ecokv::method_spec &   spec   = c.spec;
        const ecokv::method_params & params = c.params;
        const int32_t n_threads = ecokv::tools::threads_from(args);
        if (params.merge == ecokv::merge_kind::none && args.count("merged-output")) {
            throw ecokv::error("--merged-output needs --merge pivot");
        }

        const auto               t0  = std::chrono::steady_clock::now();
        const ecokv::capture_file cap = ecokv::capture_file::open(args["input"].as<std::string>());
        const auto               t1  = std::chrono::steady_clock::now();
        const std::string        input = args["input"].as<std::string>();
        const ecokv::selection   sel   = [&] {
            try {
                return ecokv::compress(cap.view(), spec, params, { n_threads });
            } catch (const ecokv::error & e) {  // name the capture in data errors (NaN, window too large)
                throw ecokv::error(input + ": " + e.what());
            }
        }();
        const auto               t2  = std::chrono::steady_clock::now();
        if (args.count("merged-output")) {  // first: it may refuse the selection, and then nothing is written
            ecokv::write_merged_rows(args["merged-output"].as<std::string>(), sel);
        }
        ecokv::write_selection_json(args["output"].as<std::string>(), sel);
        if (!args.count("quiet")) {
            const auto & v  = cap.view();
            auto         ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
            std::printf("method    %s (budget %d, window %d)\n", sel.method.c_str(), sel.budget, sel.window);
            std::printf("capture   %d layers, %d/%d heads, head_dim %d, %d tokens\n", v.n_layers, v.n_heads,
                        v.n_kv_heads, v.head_dim, v.n_tokens);
            std::printf("kept      %zu of %llu entries (%.1f%%)\n", sel.n_kept(),
                        (unsigned long long) v.n_layers * v.n_kv_heads * v.n_tokens,
                        100.0 * double(sel.kv_bytes_kept) / double(sel.kv_bytes_full));
            std::printf("kv bytes  %.3f MiB -> %.3f MiB\n", sel.kv_bytes_full / 1048576.0,
                        sel.kv_bytes_kept / 1048576.0);
            std::printf("time      read %.1f ms, compress %.1f ms\n", ms(t0, t1), ms(t1, t2));
            std::printf("wrote     %s\n", args["output"].as<std::string>().c_str());
        }
        return 0;
    });
}
