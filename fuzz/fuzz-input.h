// ecokv fuzz targets: the readers take files, so each input is written to a file of this process first.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace ecokv::fuzz {

// The targets' bodies, also run on fuzz/regressions/ by tests/test-fuzz-regressions.cpp.
int capture(const uint8_t * data, size_t size);
int head_scores(const uint8_t * data, size_t size);
int method(const uint8_t * data, size_t size);
int metric_items(const uint8_t * data, size_t size);
int datasets(const uint8_t * data, size_t size);
int chat_request(const uint8_t * data, size_t size);  // needs ecokv-serve-core (built with llama.cpp)
int entry(const uint8_t * data, size_t size);         // needs ecokv-llama

// `data` written to <tmp>/ecokv-fuzz-<pid>/<name>; returns the path.
inline std::string as_file(const uint8_t * data, size_t size, const std::string & name = "input") {
    static const std::string dir = [] {
        const auto d = std::filesystem::temp_directory_path() / ("ecokv-fuzz-" + std::to_string(::getpid()));
        std::filesystem::create_directories(d);
        return d.string();
    }();
    const std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char *>(data), std::streamsize(size));
    return path;
}

}  // namespace ecokv::fuzz
