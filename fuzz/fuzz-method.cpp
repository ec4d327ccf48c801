// The method grammar and the method options: "NAME budget window kernel pyramid-beta floor-ratio" from hostile text.
#include "fuzz-input.h"

#include "ecokv/error.h"
#include "ecokv/method.h"

#include <sstream>
#include <string>

int ecokv::fuzz::method(const uint8_t * data, size_t size) {
    std::istringstream in(std::string(reinterpret_cast<const char *>(data), size));
    std::string        name;
    in >> name;
    try {
        const ecokv::method_spec spec = ecokv::parse_method(name);
        ecokv::method_params     p;
        in >> p.budget >> p.window >> p.kernel >> p.pyramid_beta >> p.floor_ratio;
        p.validate(ecokv::method_window(spec, p));
        ecokv::requirements(spec, p);
    } catch (const ecokv::error &) {
    }
    return 0;
}

#ifndef ECOKV_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) { return ecokv::fuzz::method(data, size); }
#endif
