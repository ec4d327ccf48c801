// ecokv internals: the kernels' name for splitmix64, whose one definition is public (ecokv/hash.h) because
// ecokv-eval's niah generator draws from it too.
#pragma once

#include "ecokv/hash.h"

namespace ecokv::kernels {

using ecokv::splitmix64;

}  // namespace ecokv::kernels
