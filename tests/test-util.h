// Shared by the tests: a per-test temporary directory, file helpers and running the ecokv binary.
#pragma once

#include "ecokv/error.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace ecokv::test {

namespace fs = std::filesystem;

class temp_dir {
  public:
    temp_dir() {
        static std::atomic<int> counter{ 0 };
        const auto *            info = ::testing::UnitTest::GetInstance()->current_test_info();
        std::string             name = "ecokv-test-" + std::to_string(::getpid()) + "-" +
                           std::to_string(counter++) + "-" + (info ? info->name() : "x");
        for (char & c : name) {
            if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') {
                c = '_';
            }
        }
        path_ = fs::temp_directory_path() / name;
        fs::remove_all(path_);
        fs::create_directories(path_);
    }
    ~temp_dir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    temp_dir(const temp_dir &)             = delete;
    temp_dir & operator=(const temp_dir &) = delete;

    std::string operator/(const std::string & name) const { return (path_ / name).string(); }
    const fs::path & path() const { return path_; }

    // Names of everything in the directory.
    std::set<std::string> list() const {
        std::set<std::string> out;
        for (const auto & e : fs::directory_iterator(path_)) {
            out.insert(e.path().filename().string());
        }
        return out;
    }

    // Writes `text` to a file in the directory and returns its path.
    std::string write(const std::string & name, const std::string & text) const {
        const std::string p = (path_ / name).string();
        std::ofstream(p, std::ios::binary) << text;
        return p;
    }

  private:
    fs::path path_;
};

inline std::set<std::string> list_dir(const std::string & dir) {
    std::set<std::string> out;
    for (const auto & e : fs::directory_iterator(dir)) {
        out.insert(e.path().filename().string());
    }
    return out;
}

inline std::string read_file(const std::string & path) {
    std::ifstream      in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

inline void write_file(const std::string & path, const std::string & bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

inline std::string quote(const std::string & s) {
    std::string out = "'";
    for (char c : s) {
        if (c == '\'') {
            out += "'\\''";
        } else {
            out += c;
        }
    }
    return out + "'";
}

struct run_result {
    int         code = -1;
    std::string out;
    std::string err;
};

// Runs the ecokv binary with `args` (each quoted), stdout and stderr captured in files under `io_dir`.
inline run_result run_cli(const std::string & io_dir, const std::vector<std::string> & args) {
    static std::atomic<int> n{ 0 };
    const std::string       id  = std::to_string(n++);
    const std::string       out = io_dir + "/stdout." + id, err = io_dir + "/stderr." + id;
    std::string             cmd = quote(ECOKV_CLI);
    for (const std::string & a : args) {
        cmd += " " + quote(a);
    }
    cmd += " >" + quote(out) + " 2>" + quote(err) + " </dev/null";
    const int  status = std::system(cmd.c_str());
    run_result r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    r.out  = read_file(out);
    r.err  = read_file(err);
    return r;
}

inline std::string describe(const run_result & r) {
    return "exit " + std::to_string(r.code) + "\n--- stdout:\n" + r.out + "--- stderr:\n" + r.err;
}

inline bool contains(const std::string & text, const std::string & part) {
    return text.find(part) != std::string::npos;
}

// Runs `f` and returns the ecokv::error message it throws ("" when it throws nothing).
template <typename F> std::string error_of(F && f) {
    try {
        f();
    } catch (const ecokv::error & e) {
        return e.what();
    }
    return "";
}

}  // namespace ecokv::test
