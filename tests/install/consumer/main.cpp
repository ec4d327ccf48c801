// Uses one light thing of each library a consumer can link: the core, the evaluation library and the llama.cpp
// adapter (with llama.h itself). Prints "consumer ok" and exits 0 when all give the expected answers.
#include <ecokv/ecokv.h>
#include <ecokv/metrics.h>
#ifdef CONSUMER_LLAMA
#    include <ecokv/llama-generate.h>
#    include <ecokv/llama-session.h>
#    include <llama.h>
#endif

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

int main() {
    int  failures = 0;
    auto check    = [&](bool ok, const char * what) {
        std::printf("%-40s %s\n", what, ok ? "ok" : "FAILED");
        failures += ok ? 0 : 1;
    };

    const ecokv::method_spec spec = ecokv::parse_method("pyramidkv+ecokv");
    check(spec.allocator == "pyramidkv" && spec.scorer == "ecokv" && spec.name() == "pyramidkv+ecokv",
          "ecokv::parse_method");

    const std::vector<std::string> answers = { "107.41" };
    check(ecokv::metrics::exact_match(" 107.41 ", answers) == 1.0 &&
              ecokv::metrics::exact_match("07.07", answers) == 0.0,
          "ecokv::metrics::exact_match (ecokv::eval)");

#ifdef CONSUMER_LLAMA
    const std::vector<float> p = { 1.0f, 2.0f, 3.0f };
    check(std::fabs(ecokv::llama::kl_divergence(p, p)) < 1e-12, "ecokv::llama::kl_divergence");
    const ecokv::llama::session_options options;
    check(options.model_path.empty() && options.n_batch > 0, "ecokv::llama::session_options");
    check(llama_max_devices() >= 1, "llama_max_devices (llama.h)");
#endif
    if (failures == 0) {
        std::printf("consumer ok\n");
    }
    return failures == 0 ? 0 : 1;
}
