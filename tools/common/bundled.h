// Where `ecokv run` finds its bundled default model (tiny-vlm.gguf, its projector and sample image).
#pragma once

#include <string>

namespace ecokv::tools {

// The directory of the bundled models, first match wins:
//   1. $ECOKV_MODELS_DIR when set and not empty;
//   2. <directory of the running executable>/../share/ecokv/models (an installed tree: the path from the install
//      bindir to ${CMAKE_INSTALL_DATADIR}/ecokv/models) when it holds tiny-vlm.gguf;
//   3. the source tree's models/ this binary was built from.
// The directory is not checked further; the caller reports a missing file.
std::string bundled_models_dir();

// bundled_models_dir()/name, for a command given no --model; throws ecokv::error naming the missing file (an installed
// binary without its data) and ECOKV_MODELS_DIR.
std::string bundled_file(const std::string & name);

}  // namespace ecokv::tools
