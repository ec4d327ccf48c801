#include "common/bundled.h"

#include "ecokv/error.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#ifndef ECOKV_SOURCE_MODELS_DIR
#    error "ECOKV_SOURCE_MODELS_DIR (the source tree's models/) must be defined by the build"
#endif
#ifndef ECOKV_INSTALL_MODELS_REL
#    define ECOKV_INSTALL_MODELS_REL "../share/ecokv/models"  // from the install bindir
#endif

namespace ecokv::tools {

std::string bundled_models_dir() {
    namespace fs = std::filesystem;
    if (const char * env = std::getenv("ECOKV_MODELS_DIR"); env != nullptr && *env != '\0') {
        return env;
    }
    std::error_code ec;
    const fs::path  exe = fs::read_symlink("/proc/self/exe", ec);  // Linux; elsewhere: fall through
    if (!ec && !exe.empty()) {
        const fs::path installed = (exe.parent_path() / ECOKV_INSTALL_MODELS_REL).lexically_normal();
        if (fs::is_regular_file(installed / "tiny-vlm.gguf", ec)) {
            return installed.string();
        }
    }
    return ECOKV_SOURCE_MODELS_DIR;
}

std::string bundled_file(const std::string & name) {
    const std::string path = bundled_models_dir() + "/" + name;
    if (!std::filesystem::exists(path)) {
        throw error("no --model given and the bundled default " + path + " is missing (set ECOKV_MODELS_DIR)");
    }
    return path;
}

}  // namespace ecokv::tools
