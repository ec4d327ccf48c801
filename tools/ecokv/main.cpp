// ecokv: one binary, a table of subcommands (as llama.cpp's app/llama.cpp).
#include <cstdio>
#include <cstring>

#include <pthread.h>

int ecokv_analyze(int argc, char ** argv);
int ecokv_compress(int argc, char ** argv);
int ecokv_synth_capture(int argc, char ** argv);
int ecokv_metric(int argc, char ** argv);
int ecokv_report(int argc, char ** argv);
#ifdef ECOKV_HAVE_LLAMA
int ecokv_run(int argc, char ** argv);
int ecokv_eval(int argc, char ** argv);
int ecokv_serve(int argc, char ** argv);
#endif

namespace {

struct command {
    const char * name;
    const char * summary;
    int (*run)(int argc, char ** argv);
};

const command k_commands[] = {
#ifdef ECOKV_HAVE_LLAMA
    { "run",           "prefill a GGUF model, compress its KV cache, decode from the smaller cache", ecokv_run },
    { "eval",          "run a benchmark for every method x budget, resumable, shardable", ecokv_eval },
    { "serve",         "an OpenAI-compatible chat server with compressed, reusable conversation caches", ecokv_serve },
#endif
    { "report",        "merge eval results into a methods x budgets table (Markdown, CSV, JSON)", ecokv_report },
    { "compress",      "select the kept KV entries of a capture with any method", ecokv_compress },
    { "analyze",       "the ECOKV paper's analyses of a capture: key geometry, redundancy, what a method keeps", ecokv_analyze },
    { "synth-capture", "write a realistic random capture (demos, tests, benchmarks)", ecokv_synth_capture },
    { "metric",        "score predictions with a benchmark's official metric", ecokv_metric },
};

void usage(FILE * out) {
    std::fprintf(out, "usage: ecokv COMMAND [options]   (ecokv COMMAND --help for its options)\n\ncommands:\n");
    for (const command & c : k_commands) {
        std::fprintf(out, "  %-14s %s\n", c.name, c.summary);
    }
}

int dispatch(int argc, char ** argv) {
    if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    for (const command & c : k_commands) {
        if (std::strcmp(argv[1], c.name) == 0) {
            return c.run(argc - 1, argv + 1);
        }
    }
    std::fprintf(stderr, "ecokv: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 1;
}

// cxxopts matches arguments with std::regex, whose libstdc++ matcher recurses once or more per character: an option
// or a number of tens of kilobytes (Linux allows 128 KiB per argument) overflows the usual 8 MiB stack. The
// commands run on a thread with a stack that covers the longest argument (reserved, touched only as used).
struct call {
    int     argc;
    char ** argv;
    int     result = 1;
};

}  // namespace

int main(int argc, char ** argv) {
    call           c{ argc, argv };
    pthread_attr_t attr;
    pthread_t      thread;
    if (pthread_attr_init(&attr) == 0 && pthread_attr_setstacksize(&attr, size_t(512) << 20) == 0 &&
        pthread_create(&thread, &attr, [](void * p) -> void * {
            auto * c   = static_cast<call *>(p);
            c->result  = dispatch(c->argc, c->argv);
            return nullptr;
        }, &c) == 0) {
        pthread_join(thread, nullptr);
        return c.result;
    }
    return dispatch(argc, argv);  // no thread: the usual stack
}
