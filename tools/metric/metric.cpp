// ecokv metric: score a JSON Lines file of predictions with a benchmark's official metric.
#include "common/args.h"
#include "ecokv/metrics.h"

#include <cstdio>

namespace {

void print_metrics() {
    for (const ecokv::metric_info & m : ecokv::list_metrics()) {
        std::printf("%-9s %s%s\n", m.name.c_str(), m.description.c_str(), m.needs_type ? " (items need \"type\")" : "");
    }
}

}  // namespace

int ecokv_metric(int argc, char ** argv) {
    return ecokv::tools::run_command("metric", [&] {
        cxxopts::Options options(
            "ecokv metric",
            "Score predictions with a benchmark's official metric. The input holds one JSON object\n"
            "per line: {\"prediction\": \"...\", \"answers\": [\"...\", ...], \"type\": \"...\"}\n"
            "(\"answers\" may be one string; \"type\" is the question category, needed by ocrbench).\n"
            "Prints {\"metric\": ..., \"score\": ..., \"n\": ...} on one line.");
        // clang-format off
        options.add_options()
            ("m,metric", "metric name (see --list)", cxxopts::value<std::string>())
            ("i,input", "predictions, JSON Lines", cxxopts::value<std::string>())
            ("list", "list the metrics, then exit")
            ("h,help", "show this help");
        // clang-format on
        const auto args = options.parse(argc, argv);
        ecokv::tools::reject_positional(args);
        if (args.count("help")) {
            std::printf("%s\nmetrics:\n", options.help().c_str());
            print_metrics();
            return 0;
        }
        if (args.count("list")) {
            print_metrics();
            return 0;
        }
        ecokv::tools::require(args, { "metric", "input" });
        const std::string name = args["metric"].as<std::string>();
        ecokv::find_metric(name);  // an unknown name fails before the file is read
        const auto items  = ecokv::read_metric_items(args["input"].as<std::string>(), name);
        const auto result = ecokv::evaluate(name, items);
        const auto line   = ecokv::metric_result_json(result);
        std::printf("%s\n", line.c_str());
        return 0;
    });
}
