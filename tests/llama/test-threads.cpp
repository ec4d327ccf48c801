// default_thread_count (what -t 0 means): the physical cores this process may run on, counted here independently
// from /proc/cpuinfo's (physical id, core id) pairs, and 1 under an affinity mask of one CPU.
#include "ecokv/llama-session.h"

#include <gtest/gtest.h>

#include <sched.h>

#include <cmath>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace {

// Distinct (physical id, core id) among the CPUs of `set`, from /proc/cpuinfo.
int32_t cores_from_cpuinfo(const cpu_set_t & set) {
    std::ifstream                 in("/proc/cpuinfo");
    std::set<std::pair<int, int>> cores;
    int                           cpu = -1, package = 0;
    for (std::string line; std::getline(in, line);) {
        const auto value = [&] { return std::stoi(line.substr(line.find(':') + 1)); };
        if (line.rfind("processor", 0) == 0) {
            cpu = value();
        } else if (line.rfind("physical id", 0) == 0) {
            package = value();
        } else if (line.rfind("core id", 0) == 0 && cpu >= 0 && CPU_ISSET(cpu, &set)) {
            cores.insert({ package, value() });
        }
    }
    return int32_t(cores.size());
}

TEST(threads, default_is_the_physical_cores_of_the_affinity_mask) {
    cpu_set_t all;
    ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
    int32_t       want = cores_from_cpuinfo(all);
    std::ifstream quota_file("/sys/fs/cgroup/cpu.max");
    std::string   quota;
    double        period = 0;
    if (quota_file >> quota >> period && quota != "max") {
        want = std::min(want, std::max(1, int32_t(std::ceil(std::stod(quota) / period))));
    }
    if (want == 0) {
        GTEST_SKIP() << "no core ids in /proc/cpuinfo";
    }
    EXPECT_EQ(ecokv::llama::default_thread_count(), want);

    cpu_set_t one;  // the first CPU of the mask alone
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &one);
            break;
        }
    }
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    const int32_t under_one = ecokv::llama::default_thread_count();
    ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
    EXPECT_EQ(under_one, 1);
}

}  // namespace
