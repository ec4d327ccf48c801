#include "common/engine-flags.h"

#include "ecokv/llama-options.h"


namespace ecokv::tools {

void add_engine_options(cxxopts::Options & options, const llama::session_options & defaults) {
    for (const llama::engine_option & o : llama::engine_options()) {
        add_flag(options, "engine", o, option_text(o.get(o, defaults)));
    }
}

llama::session_options engine_options_from(const cxxopts::ParseResult & args, llama::session_options base) {
    apply_flags(args, llama::engine_options(), base, llama::set_engine_option);
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

}  // namespace ecokv::tools
