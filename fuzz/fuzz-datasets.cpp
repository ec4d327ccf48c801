// Every dataset reader from hostile bytes, written under each file name the readers look for.
#include "fuzz-input.h"

#include "ecokv/datasets.h"
#include "ecokv/error.h"

#include <cstdio>

int ecokv::fuzz::datasets(const uint8_t * data, size_t size) {
    std::string dir;
    for (const char * name : { "items.jsonl", "val.json", "val_v1.0.json", "niah.json" }) {
        const std::string path = ecokv::fuzz::as_file(data, size, name);
        dir                    = path.substr(0, path.rfind('/'));
    }
    for (const auto & d : ecokv::list_datasets()) {
        try {
            ecokv::load_dataset(d.name, dir);
        } catch (const ecokv::error &) {
        }
    }
    return 0;
}

#ifndef ECOKV_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) { return ecokv::fuzz::datasets(data, size); }
#endif
