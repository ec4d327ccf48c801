// The metric input reader (predictions and references, JSONL) from hostile bytes, scored by every metric.
#include "fuzz-input.h"

#include "ecokv/error.h"
#include "ecokv/metrics.h"

int ecokv::fuzz::metric_items(const uint8_t * data, size_t size) {
    const std::string path = ecokv::fuzz::as_file(data, size, "items.jsonl");
    for (const auto & m : ecokv::list_metrics()) {
        try {
            const auto items = ecokv::read_metric_items(path, m.name);
            ecokv::metric_result_json(ecokv::evaluate(m.name, items));
        } catch (const ecokv::error &) {
        }
    }
    return 0;
}

#ifndef ECOKV_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) { return ecokv::fuzz::metric_items(data, size); }
#endif
