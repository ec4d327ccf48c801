#include "common/args.h"

#include "ecokv/error.h"

#include <algorithm>

#include <cstdint>
#include <cstdio>
#include <sstream>

namespace ecokv::tools {

namespace {

bool skipped(std::string_view key, std::initializer_list<std::string_view> skip) {
    return std::find(skip.begin(), skip.end(), key) != skip.end();
}

}  // namespace

void add_compression_options(cxxopts::Options & options, unsigned scopes, const compression & defaults,
                             std::initializer_list<std::string_view> skip, bool method_default) {
    for (const option_info & o : compression_options()) {
        if ((o.scope & scopes) && !skipped(o.key, skip)) {
            const bool shown = o.kind != option_kind::method || method_default;
            add_flag(options, "method", o, shown ? option_text(o.get(o, defaults)) : "");
        }
    }
}

void add_flag(cxxopts::Options & options, const std::string & group, const option_spec & o,
              const std::string & default_text) {
    std::string help(o.help);
    if (!o.choices.empty()) {
        help += ": " + choices_text(o);
    }
    if (!o.unset.empty()) {
        help += " (default: " + std::string(o.unset) + ")";
    }
    auto value = cxxopts::value<std::string>();
    if (o.kind == option_kind::flag) {
        value->implicit_value("true");  // --no-mmproj-offload, as llama.cpp spells it: no value
    } else if (!default_text.empty()) {
        value->default_value(default_text);
    }
    const std::string names = (o.short_name ? std::string(1, o.short_name) + "," : "") + o.flag();
    options.add_options(group)(names, help, value);
}

compression compression_from(const cxxopts::ParseResult & args, compression base) {
    apply_flags(args, compression_options(), base, set_option);
    return base;
}

std::optional<cxxopts::ParseResult> parse_options(cxxopts::Options & options, int argc, char ** argv,
                                                  const flag_aliases & aliases) {
    std::vector<std::string> words(argv, argv + argc);
    for (std::string & w : words) {
        for (const auto & [alias, flag] : aliases) {
            if (w == alias) {
                w = flag;
            }
        }
    }
    std::vector<char *> args;
    for (std::string & w : words) {
        args.push_back(w.data());
    }
    auto parsed = options.parse(int(args.size()), args.data());
    if (parsed.count("help")) {
        std::printf("%s\n", options.help({ "", "method", "engine" }).c_str());
        return std::nullopt;
    }
    reject_positional(parsed);
    return parsed;
}

int32_t int_in_range(const cxxopts::ParseResult & args, const char * name, int32_t lo, int32_t hi) {
    const int32_t v = args[name].as<int32_t>();
    if (v < lo || v > hi) {
        throw error("--" + std::string(name) + " " + std::to_string(v) + " must lie in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
    }
    return v;
}

int32_t threads_from(const cxxopts::ParseResult & args) { return int_in_range(args, "threads", 0, 512); }

std::vector<std::string> split_list(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream        in(s);
    for (std::string part; std::getline(in, part, ',');) {
        if (!part.empty()) {
            out.push_back(part);
        }
    }
    return out;
}

void require(const cxxopts::ParseResult & args, std::initializer_list<const char *> names) {
    for (const char * n : names) {
        if (args.count(n) == 0) {
            throw error(std::string("missing --") + n + " (see --help)");
        }
    }
}

void reject_positional(const cxxopts::ParseResult & args) {
    if (!args.unmatched().empty()) {
        throw error("unexpected argument '" + args.unmatched().front() + "'");
    }
}

namespace {

// A message cut to about n bytes in its middle ("Option 'xxx...xxx' does not exist"): cxxopts quotes an unknown
// option whole, however long. Cuts fall on UTF-8 character boundaries.
std::string shortened(std::string m, size_t n) {
    if (m.size() <= n) {
        return m;
    }
    auto boundary = [&](size_t i) {
        while (i > 0 && i < m.size() && (uint8_t(m[i]) & 0xC0) == 0x80) {
            --i;
        }
        return i;
    };
    const size_t head = boundary(n * 2 / 3), tail = boundary(m.size() - n / 3);
    return m.substr(0, head) + "..." + m.substr(tail);
}

}  // namespace

int run_command(const char * name, const std::function<int()> & body) {
    try {
        return body();
    } catch (const error & e) {
        std::fprintf(stderr, "ecokv %s: error: %s\n", name, e.what());
    } catch (const cxxopts::exceptions::exception & e) {
        std::fprintf(stderr, "ecokv %s: error: %s (see --help)\n", name, shortened(e.what(), 160).c_str());
    } catch (const std::exception & e) {
        std::fprintf(stderr, "ecokv %s: error: %s\n", name, e.what());
    }
    return 1;
}

}  // namespace ecokv::tools
