// The option table (ecokv/options.h): values set from text and numbers land in the fields SPEC names, ranges and
// choices are refused with the option named, the defaults are method_params{}'s, and a compression's key is canonical.
// Expected values are written by hand here, not read back from the table.
#include "ecokv/options.h"

#include <gtest/gtest.h>

#include <set>

namespace {

using ecokv::compression;
using ecokv::option_error;

// The option error a call throws: its key and message.
std::pair<std::string, std::string> error_of(const std::function<void()> & f) {
    try {
        f();
    } catch (const option_error & e) {
        return { e.key, e.what() };
    }
    return { "none", "" };
}

TEST(options, text_and_numbers_set_the_method_parameters) {
    compression c;
    ecokv::set_option(c, "method", std::string("pyramidkv+mixkv"));
    ecokv::set_option(c, "budget", std::string("40"));
    ecokv::set_option(c, "window", int64_t(8));
    ecokv::set_option(c, "alpha", std::string("0.25"));
    ecokv::set_option(c, "beta", 1.0);
    ecokv::set_option(c, "floor-ratio", std::string("0.3"));  // the flag's spelling finds the row too
    ecokv::set_option(c, "pool", std::string("max"));
    ecokv::set_option(c, "centroid", std::string("prefix"));
    ecokv::set_option(c, "mixkv_scale", std::string("importance"));
    ecokv::set_option(c, "ecokv_weights", std::string("figure3"));
    ecokv::set_option(c, "merge", std::string("pivot"));
    ecokv::set_option(c, "sinks", int64_t(2));
    ecokv::set_option(c, "seed", std::string("9007199254740993"));  // 2^53 + 1: no double holds it
    ecokv::set_option(c, "chunk", 96.0);  // a whole JSON float is a whole number
    EXPECT_EQ(c.spec.name(), "pyramidkv+mixkv");
    EXPECT_EQ(c.params.budget, 40);
    EXPECT_EQ(c.params.window, 8);
    EXPECT_EQ(c.params.alpha, 0.25);
    EXPECT_EQ(c.params.beta, 1.0);
    EXPECT_EQ(c.params.floor_ratio, 0.3);
    EXPECT_EQ(c.params.pool, ecokv::pool_kind::max);
    EXPECT_EQ(c.params.centroid, ecokv::centroid_kind::prefix);
    EXPECT_EQ(c.params.mixkv_scale, ecokv::mixkv_scale_kind::importance);
    EXPECT_EQ(c.params.ecokv_weights, ecokv::ecokv_weights_kind::figure3);
    EXPECT_EQ(c.params.merge, ecokv::merge_kind::pivot);
    EXPECT_EQ(c.params.n_sink, 2);
    EXPECT_EQ(c.params.seed, 9007199254740993ull);
    EXPECT_EQ(c.chunk, 96);
    EXPECT_NO_THROW(c.validate());
}

TEST(options, the_defaults_are_the_method_parameters_defaults) {
    const compression c;
    EXPECT_EQ(c.spec.name(), "uniform+ecokv");  // the registry's default method, SnapKV + ECOKV
    EXPECT_EQ(ecokv::option_text(ecokv::get_option(c, "budget")), "64");
    EXPECT_EQ(ecokv::option_text(ecokv::get_option(c, "alpha")), "0.8");
    EXPECT_EQ(ecokv::option_text(ecokv::get_option(c, "beta")), "0.6");
    EXPECT_EQ(ecokv::option_text(ecokv::get_option(c, "pool")), "avg");
    EXPECT_TRUE(std::holds_alternative<std::monostate>(ecokv::get_option(c, "window")));  // the scorer's
    EXPECT_TRUE(std::holds_alternative<std::monostate>(ecokv::get_option(c, "floor_ratio")));
    EXPECT_EQ(c.key(), "uniform+ecokv budget=64 window=- kernel=5 pool=avg alpha=0.8 beta=0.6 tau=0 centroid=all "
                       "mixkv_scale=attention ecokv_weights=equations floor_ratio=- pyramid_beta=20 theta=0.9 sinks=4 "
                       "head_scores=- seed=0 merge=none chunk=0 decode_compress=0 recompress_slack=-1");
    EXPECT_EQ(compression::none().key(), "full");
    EXPECT_EQ(compression::none().name(), "full");
    EXPECT_FALSE(ecokv::compression_named("full").enabled);
    EXPECT_EQ(ecokv::compression_named("snapkv+mixkv").name(), "uniform+mixkv");
}

TEST(options, bad_values_name_the_option) {
    compression c;
    using kv = std::pair<std::string, std::string>;
    EXPECT_EQ(error_of([&] { ecokv::set_option(c, "alpha", 1.5); }), kv("alpha", "--alpha 1.5 must lie in [0, 1]"));
    EXPECT_EQ(error_of([&] { ecokv::set_option(c, "theta", int64_t(0)); }),
              kv("theta", "--theta 0 must lie in (0, 1]"));
    EXPECT_EQ(error_of([&] { ecokv::set_option(c, "window", int64_t(0)); }),
              kv("window", "--window 0 must be at least 1"));
    EXPECT_EQ(error_of([&] { ecokv::set_option(c, "chunk", int64_t(-1)); }),
              kv("chunk", "--chunk -1 must lie in [0, 16777216]"));
    EXPECT_EQ(error_of([&] { ecokv::set_option(c, "budget", std::string("64x")); }),
              kv("budget", "--budget '64x' is not a number"));
    EXPECT_EQ(error_of([&] { ecokv::set_option(c, "budget", 6.5); }),
              kv("budget", "--budget '6.5' is not a whole number"));
    EXPECT_EQ(error_of([&] { ecokv::set_option(c, "pool", std::string("mean")); }),
              kv("pool", "--pool must be avg or max, not 'mean'"));
    EXPECT_EQ(error_of([&] { ecokv::set_option(c, "pool", int64_t(1)); }), kv("pool", "--pool must be avg or max"));
    EXPECT_EQ(error_of([&] { ecokv::set_option(c, "budegt", int64_t(1)); }).first, "");  // unknown: no key
    EXPECT_EQ(error_of([&] { ecokv::set_option(c, "method", std::string("snapk")); }).first, "method");
    EXPECT_EQ(c.key(), compression().key());  // nothing was set by a refused value
}

TEST(options, rules_between_options_name_the_one_at_fault) {
    compression c;
    c.params.budget = 4;  // ECOKV's window is 4
    EXPECT_EQ(error_of([&] { c.validate(); }),
              std::make_pair(std::string("budget"),
                             std::string("--budget 4 must be larger than --window 4 (the budget includes the window)")));
    c.params.budget = 64;
    c.params.kernel = 4;
    EXPECT_EQ(error_of([&] { c.validate(); }).first, "kernel");
    c.params.kernel = 5;
    c.params.alpha  = -0.5;  // set directly: validate() checks the table's ranges too
    EXPECT_EQ(error_of([&] { c.validate(); }).second, "--alpha -0.5 must lie in [0, 1]");
    c.params.alpha = 0.8;
    c.chunk        = 4;  // not larger than ECOKV's window
    EXPECT_EQ(error_of([&] { c.validate(); }).first, "chunk");
    c.spec  = ecokv::parse_method("h2o");
    c.chunk = 100;  // H2O's accumulated attention streams from chunk to chunk
    EXPECT_NO_THROW(c.validate());
    EXPECT_NO_THROW(compression::none().validate());
}

// Every field of method_params is reachable through one row: setting each row to a value other than its default
// changes the key, and the keys are distinct.
TEST(options, every_row_changes_the_key) {
    std::set<std::string> keys = { compression().key() };
    for (const ecokv::option_info & o : ecokv::compression_options()) {
        compression c;
        const ecokv::option_value other =
            o.kind == ecokv::option_kind::choice   ? ecokv::option_value{ std::string(o.choices.back()) }
            : o.kind == ecokv::option_kind::method ? ecokv::option_value{ std::string("h2o") }
            : o.kind == ecokv::option_kind::path   ? ecokv::option_value{ std::string("scores.json") }
                                                   : ecokv::option_value{ int64_t(o.lo_open ? 1 : o.lo + 1) };
        ecokv::set_option(c, o.key, other);
        EXPECT_TRUE(keys.insert(c.key()).second) << o.key;
        EXPECT_EQ(o.flag().find('_'), std::string::npos) << o.key;
    }
}

}  // namespace
