// default_thread_count (ecokv/llama-session.h): what -t 0 means, as llama.cpp's tools choose it (common.cpp's
// cpu_get_num_math: the physical cores), within what this process may use: its CPU affinity and a cgroup v2 quota.
#include "ecokv/llama-session.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <string>
#include <thread>

namespace ecokv::llama {

namespace {

// The CPUs of this process's affinity mask that are distinct cores: one per set of hyperthread siblings.
int32_t physical_cores_in_affinity() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        return int32_t(std::max(1u, std::thread::hardware_concurrency()));
    }
    std::set<std::string> cores;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) {
            std::ifstream siblings("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list");
            std::string   list;
            cores.insert(std::getline(siblings, list) ? list : std::to_string(cpu));
        }
    }
    return int32_t(cores.size());
}

// ceil(quota / period) of cgroup v2's cpu.max ("max 100000" when unlimited); 0 when there is none.
int32_t cgroup_cpu_limit() {
    std::ifstream in("/sys/fs/cgroup/cpu.max");
    std::string   quota;
    double        period = 0;
    if (!(in >> quota >> period) || quota == "max" || period <= 0) {
        return 0;
    }
    try {
        return std::max(1, int32_t(std::ceil(std::stod(quota) / period)));
    } catch (const std::exception &) {
        return 0;
    }
}

}  // namespace

int32_t default_thread_count() {
    const int32_t cores = std::max(1, physical_cores_in_affinity());
    const int32_t quota = cgroup_cpu_limit();
    return quota > 0 ? std::min(cores, quota) : cores;
}

}  // namespace ecokv::llama
