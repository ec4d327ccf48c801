#include "common/engine-flags.h"

#include "ecokv/llama-options.h"

#include <cstdio>

namespace ecokv::tools {

void add_engine_options(cxxopts::Options & options, const llama::session_options & defaults) {
    for (const llama::engine_option & o : llama::engine_options()) {
        add_flag(options, "engine", o, option_text(o.get(o, defaults)));
    }
    options.add_options("engine")("list-devices", "print the GPU devices and exit");
}

llama::session_options engine_options_from(const cxxopts::ParseResult & args, llama::session_options base) {
    apply_flags(args, llama::engine_options(), base, llama::set_engine_option);
    if (args.count("n-gpu-layers") && base.n_gpu_layers != 0 && !llama::gpu_offload_supported()) {
        std::fprintf(stderr, "ecokv: warning: no usable GPU found, --n-gpu-layers is ignored (a CPU-only build? "
                             "scripts/setup.sh --backend vulkan or cuda builds one with a GPU backend)\n");
    }
    return base;
}

flag_aliases engine_aliases() {
    flag_aliases out;
    for (const llama::engine_option & o : llama::engine_options()) {
        if (!o.alias.empty()) {
            out.emplace_back(o.alias, "--" + o.flag());
        }
    }
    return out;
}

std::optional<cxxopts::ParseResult> parse_engine_command(cxxopts::Options & options, int argc, char ** argv) {
    auto parsed = parse_options(options, argc, argv, engine_aliases());
    if (parsed && parsed->count("list-devices")) {
        const auto devices = llama::list_devices();
        std::printf("Available devices:\n");
        if (devices.empty()) {
            std::printf("  (none)\n");
        }
        for (const llama::device_info & d : devices) {
            std::printf("  %s: %s (%llu MiB, %llu MiB free)\n", d.name.c_str(), d.description.c_str(),
                        (unsigned long long) (d.total_bytes >> 20), (unsigned long long) (d.free_bytes >> 20));
        }
        return std::nullopt;
    }
    return parsed;
}

}  // namespace ecokv::tools
