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

}  // namespace ecokv::tools
