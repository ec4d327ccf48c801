// Uniform allocation (SnapKV and every plain scorer): C_{l,g} = B - N for every layer and KV head (SPEC §6).
#include "common.h"

namespace ecokv::allocators {
namespace {
class uniform final : public allocator_i {
    allocation allocate(const allocator_input & in) const override { return uniform_allocation(in); }
};
}  // namespace
allocator_ptr make_uniform() { return std::make_unique<uniform>(); }
}  // namespace ecokv::allocators
