// Offload options: llama.cpp's -ngl, --device and --list-devices (common/arg.cpp: parse_device_list,
// common_print_available_devices) without llama.cpp's common library.
#include "devices.h"

#include "ecokv/error.h"
#include "ecokv/llama-options.h"

#include <sstream>

namespace ecokv::llama {

namespace {

bool is_gpu(ggml_backend_dev_t dev) { return ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU; }

std::string known_devices() {
    std::string out;
    for (const device_info & d : list_devices()) {
        out += (out.empty() ? "" : ", ") + d.name + " (" + d.description + ")";
    }
    return out.empty() ? "this build has none (scripts/setup.sh --backend vulkan or cuda builds one; Vulkan lists a "
                         "CPU device such as lavapipe only with GGML_VK_VISIBLE_DEVICES set)"
                       : "available: " + out;
}

}  // namespace

std::vector<device_info> list_devices() {
    std::vector<device_info> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (is_gpu(dev)) {
            size_t free = 0, total = 0;
            ggml_backend_dev_memory(dev, &free, &total);
            out.push_back({ ggml_backend_dev_name(dev), ggml_backend_dev_description(dev), total, free });
        }
    }
    return out;
}

bool gpu_offload_supported() { return llama_supports_gpu_offload(); }

std::vector<ggml_backend_dev_t> offload_devices(const session_options & o) {
    if (o.devices.empty()) {
        return {};
    }
    if (o.devices == "none") {
        return { nullptr };
    }
    std::vector<ggml_backend_dev_t> out;
    std::stringstream               in(o.devices);
    for (std::string name; std::getline(in, name, ',');) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
        if (name.empty() || dev == nullptr || !is_gpu(dev)) {
            throw error(engine_option_name("device") + " " + o.devices + ": no device '" + name + "'; " + known_devices());
        }
        out.push_back(dev);
    }
    out.push_back(nullptr);
    return out;
}

llama_model_params model_params(const session_options & o, const std::vector<ggml_backend_dev_t> & devices) {
    llama_model_params p = llama_model_default_params();
    p.n_gpu_layers       = o.llama_gpu_layers();
    if (!devices.empty()) {
        p.devices = const_cast<ggml_backend_dev_t *>(devices.data());
    }
    return p;
}

ggml_backend_dev_t projector_device(const std::vector<ggml_backend_dev_t> & devices) {
    return devices.empty() ? nullptr : devices.front();
}

}  // namespace ecokv::llama
