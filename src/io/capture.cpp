// Capture files (SPEC §7) on top of the safetensors reader/writer.
#include "ecokv/capture.h"

#include "ecokv/safetensors.h"
#include "impl.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace ecokv {

struct capture_file::impl {
    safetensors_file file;
};

namespace {

int32_t metadata_int(const safetensors_file & f, const char * key) {
    const auto it = f.metadata().find(key);
    if (it == f.metadata().end()) {
        ECOKV_THROW("%s: __metadata__ lacks \"%s\" (not an ecokv capture?)", f.path().c_str(), key);
    }
    char *     end = nullptr;
    const long v   = std::strtol(it->second.c_str(), &end, 10);
    if (end == it->second.c_str() || *end != '\0' || v <= 0 || v > (1L << 30)) {
        ECOKV_THROW("%s: __metadata__ \"%s\" = \"%s\" is not a positive integer", f.path().c_str(), key,
                    it->second.c_str());
    }
    return int32_t(v);
}

void check_shape(const tensor_view & v, const char * name, int64_t d0, int64_t d1, int64_t d2,
                 bool encoded_ok = false) {
    if (v.ne[2] != d0 || v.ne[1] != d1 || (d2 >= 0 && v.ne[0] != d2) || v.ne[3] != 1) {
        ECOKV_THROW("tensor %s has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                    (long long) v.ne[2], (long long) v.ne[1], (long long) v.ne[0], (long long) d0, (long long) d1,
                    (long long) (d2 >= 0 ? d2 : v.ne[0]));
    }
    if (v.type == dtype::u8) {
        ECOKV_THROW("tensor %s must be F32 or F16, not U8", name);
    }
    if (v.type == dtype::encoded) {  // an engine's quantized K/V rows; queries stay F32 or F16
        if (!encoded_ok) {
            ECOKV_THROW("tensor %s must be F32 or F16, not an engine's encoded rows", name);
        }
        if (v.codec == nullptr || v.codec->to_f32 == nullptr || v.ne[0] % v.codec->block_size != 0) {
            ECOKV_THROW("tensor %s: rows of %lld elements are not whole %s blocks", name, (long long) v.ne[0],
                        v.codec ? v.codec->name : "encoded");
        }
    }
}

const tensor_view & layer_tensor(const layer_capture & lc, int32_t k) {
    return k == 0 ? lc.keys : k == 1 ? lc.values : k == 2 ? lc.queries : lc.full_queries;
}

// True when every element of slice i2 is finite: exponent bits not all ones (vectorised bit test); encoded rows
// are decoded one at a time.
bool slice_finite(const tensor_view & v, int64_t i2) {
    unsigned           bad = 0;
    std::vector<float> decoded(v.type == dtype::encoded ? size_t(v.ne[0]) : 0);
    for (int64_t i1 = 0; i1 < v.ne[1]; ++i1) {
        if (v.type == dtype::encoded) {
            v.row_f32(i1, i2, decoded.data());
            for (const float x : decoded) {
                bad |= !std::isfinite(x);
            }
            continue;
        }
        const void * row = v.row(i1, i2);
        if (v.type == dtype::f32) {
            const auto * x = static_cast<const uint32_t *>(row);
#pragma omp simd reduction(| : bad)
            for (int64_t i = 0; i < v.ne[0]; ++i) {
                bad |= (x[i] & 0x7f800000u) == 0x7f800000u;
            }
        } else if (v.type == dtype::f16) {
            const auto * x = static_cast<const uint16_t *>(row);
#pragma omp simd reduction(| : bad)
            for (int64_t i = 0; i < v.ne[0]; ++i) {
                bad |= (x[i] & 0x7c00u) == 0x7c00u;
            }
        }
    }
    return bad == 0;
}

}  // namespace

head_view capture_view::head(int32_t il, int32_t ig) const {
    if (heads.empty()) {
        return { layers[il].keys, layers[il].values, ig, n_tokens, modality };
    }
    const head_tokens & h = heads[size_t(il) * n_kv_heads + ig];
    return { h.keys, h.values, 0, int32_t(h.keys.ne[1]), h.modality };
}

namespace {

void check_modality(const std::vector<uint8_t> & m, int64_t n, const std::string & name) {
    if (!m.empty() && int64_t(m.size()) != n) {
        ECOKV_THROW("tensor %s has %zu entries, expected %lld", name.c_str(), m.size(), (long long) n);
    }
    for (uint8_t v : m) {
        if (v > uint8_t(modality::audio)) {
            ECOKV_THROW("tensor %s holds %u; allowed: 0 text, 1 image, 2 audio", name.c_str(), unsigned(v));
        }
    }
}

}  // namespace

// Per-head tokens: each head's rows within [n_queries, n_tokens], the shared layer views absent.
void capture_view::validate_heads() const {
    if (heads.size() != size_t(n_layers) * n_kv_heads) {
        ECOKV_THROW("capture has %zu per-head token sets for %d layers x %d KV heads", heads.size(), n_layers,
                    n_kv_heads);
    }
    if (!modality.empty()) {
        ECOKV_THROW("a capture with per-head tokens has modality per head");
    }
    const int64_t n_full = has_full_queries() ? layers[0].full_queries.ne[1] : 0;
    for (size_t i = 0; i < heads.size(); ++i) {
        const head_tokens & h = heads[i];
        const std::string   p = "heads." + std::to_string(i) + ".";
        const int64_t       n = h.keys.ne[1];
        if (n < n_queries || n > n_tokens) {
            ECOKV_THROW("%skeys holds %lld tokens, outside [%d window queries, %d tokens]", p.c_str(), (long long) n,
                        n_queries, n_tokens);
        }
        check_shape(h.keys, (p + "keys").c_str(), 1, n, head_dim, true);
        check_shape(h.values, (p + "values").c_str(), 1, n, head_dim_v, true);
        check_modality(h.modality, n, p + "modality");
        if (n_full > n) {
            ECOKV_THROW("%skeys holds %lld tokens, fewer than the %lld full queries", p.c_str(), (long long) n,
                        (long long) n_full);
        }
        if (!h.prior_attention.empty() && int64_t(h.prior_attention.size()) != n) {
            ECOKV_THROW("%sprior_attention holds %zu values for %lld tokens", p.c_str(), h.prior_attention.size(),
                        (long long) n);
        }
        for (const float a : h.prior_attention) {
            if (!std::isfinite(a) || a < 0) {
                ECOKV_THROW("%sprior_attention holds %g (accumulated attention is finite and >= 0)", p.c_str(),
                            double(a));
            }
        }
    }
}

void capture_view::validate() const {
    if (n_layers <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim_v <= 0 || n_tokens <= 0 ||
        n_queries <= 0) {
        ECOKV_THROW("capture dimensions must be positive (n_layers %d, n_heads %d, n_kv_heads %d, head_dim %d, "
                    "n_tokens %d, queries %d)", n_layers, n_heads, n_kv_heads, head_dim, n_tokens, n_queries);
    }
    if (n_heads % n_kv_heads != 0) {
        ECOKV_THROW("n_heads %d is not a multiple of n_kv_heads %d", n_heads, n_kv_heads);
    }
    if (n_queries > n_tokens) {
        ECOKV_THROW("capture holds %d window queries but only %d tokens", n_queries, n_tokens);
    }
    if (int32_t(layers.size()) != n_layers) {
        ECOKV_THROW("capture has %zu layers, metadata says n_layers %d", layers.size(), n_layers);
    }
    if (!heads.empty()) {
        validate_heads();
    }
    check_modality(modality, n_tokens, "modality");
    const bool full = has_full_queries();
    for (int32_t il = 0; il < n_layers; ++il) {
        const layer_capture & lc = layers[il];
        const std::string     p  = "layers." + std::to_string(il) + ".";
        if (heads.empty()) {
            check_shape(lc.keys, (p + "keys").c_str(), n_kv_heads, n_tokens, head_dim, true);
            check_shape(lc.values, (p + "values").c_str(), n_kv_heads, n_tokens, head_dim_v, true);
        }
        check_shape(lc.queries, (p + "queries").c_str(), n_heads, n_queries, head_dim);
        if (lc.full_queries.empty() == full) {
            ECOKV_THROW("tensor %sfull_queries must be present in every layer or in none", p.c_str());
        }
        if (full) {  // per-head tokens: the queries of every head's last tokens, as many in every layer
            check_shape(lc.full_queries, (p + "full_queries").c_str(), n_heads,
                        heads.empty() ? n_tokens : layers[0].full_queries.ne[1], head_dim);
        }
    }
}

void capture_view::check_finite(int32_t il, int32_t ig) const {
    static const char * const names[] = { "keys", "values", "queries", "full_queries" };
    const int32_t             group   = n_heads / n_kv_heads;
    const head_view           h       = head(il, ig);
    for (int32_t k = 0; k < 4; ++k) {
        const bool          by_kv = k < 2;  // keys and values: the head's slice; queries: the group's heads
        const tensor_view & v     = k == 0 ? h.keys : k == 1 ? h.values : layer_tensor(layers[il], k);
        const int64_t       first = k < 2 ? h.slice : int64_t(ig) * group;
        for (int64_t i2 = first; !v.empty() && i2 < (by_kv ? first + 1 : first + group); ++i2) {
            if (!slice_finite(v, i2)) {
                throw non_finite_error(detail::format("tensor layers.%d.%s holds NaN or infinite values", il, names[k]));
            }
        }
    }
}

void capture_view::check_finite() const {
    for (int32_t il = 0; il < n_layers; ++il) {
        for (int32_t ig = 0; ig < n_kv_heads; ++ig) {
            check_finite(il, ig);
        }
    }
}

const std::map<std::string, std::string> & capture_file::metadata() const {
    return impl_->file.metadata();
}

capture_file capture_file::open(const std::string & path) {
    auto        impl = std::make_shared<capture_file::impl>(capture_file::impl{ safetensors_file::open(path) });
    const auto & f   = impl->file;
    capture_file c;
    capture_view & v = c.view_;
    v.n_layers       = metadata_int(f, "n_layers");
    v.n_heads        = metadata_int(f, "n_heads");
    v.n_kv_heads     = metadata_int(f, "n_kv_heads");
    v.head_dim       = metadata_int(f, "head_dim");
    v.n_tokens       = metadata_int(f, "n_tokens");
    if (auto it = f.metadata().find("model"); it != f.metadata().end()) {
        v.model = it->second;
    }
    auto require = [&](const std::string & name) -> const safetensors_tensor & {
        const safetensors_tensor * t = f.find(name);
        if (t == nullptr) {
            ECOKV_THROW("%s: tensor '%s' is missing", path.c_str(), name.c_str());
        }
        if (t->shape.size() != 3) {
            ECOKV_THROW("%s: tensor '%s' must have 3 dimensions, has %zu", path.c_str(), name.c_str(), t->shape.size());
        }
        return *t;
    };
    for (int32_t il = 0; il < v.n_layers; ++il) {
        const std::string p = "layers." + std::to_string(il) + ".";
        layer_capture     lc;
        lc.keys    = require(p + "keys").view();
        lc.values  = require(p + "values").view();
        lc.queries = require(p + "queries").view();
        if (f.find(p + "full_queries") != nullptr) {
            lc.full_queries = require(p + "full_queries").view();
        }
        v.layers.push_back(lc);
    }
    v.head_dim_v = int32_t(v.layers[0].values.ne[0]);
    v.n_queries  = int32_t(v.layers[0].queries.ne[1]);
    if (const safetensors_tensor * m = f.find("modality")) {
        if (m->type != dtype::u8 || m->shape.size() != 1) {
            ECOKV_THROW("%s: tensor 'modality' must be U8 [n_tokens]", path.c_str());
        }
        v.modality.assign(reinterpret_cast<const uint8_t *>(m->bytes.data()),
                          reinterpret_cast<const uint8_t *>(m->bytes.data()) + m->bytes.size());
    }
    try {
        v.validate();
    } catch (const error & e) {
        ECOKV_THROW("%s: %s", path.c_str(), e.what());
    }
    c.impl_ = std::move(impl);
    return c;
}

void write_capture(const std::string & path, const capture_view & cap,
                   const std::map<std::string, std::string> & extra_metadata) {
    cap.validate();
    safetensors_writer w;
    for (int32_t il = 0; il < cap.n_layers; ++il) {
        const std::string     p  = "layers." + std::to_string(il) + ".";
        const layer_capture & lc = cap.layers[il];
        w.add(p + "keys", lc.keys, 3);
        w.add(p + "values", lc.values, 3);
        w.add(p + "queries", lc.queries, 3);
        if (!lc.full_queries.empty()) {
            w.add(p + "full_queries", lc.full_queries, 3);
        }
    }
    if (!cap.modality.empty()) {
        const int64_t          n = int64_t(cap.modality.size());
        std::vector<std::byte> bytes(cap.modality.size());
        std::memcpy(bytes.data(), cap.modality.data(), bytes.size());
        w.add("modality", dtype::u8, { n }, std::move(bytes));
    }
    w.set_metadata("n_layers", std::to_string(cap.n_layers));
    w.set_metadata("n_heads", std::to_string(cap.n_heads));
    w.set_metadata("n_kv_heads", std::to_string(cap.n_kv_heads));
    w.set_metadata("head_dim", std::to_string(cap.head_dim));
    w.set_metadata("head_dim_v", std::to_string(cap.head_dim_v));
    w.set_metadata("n_tokens", std::to_string(cap.n_tokens));
    if (!cap.model.empty()) {
        w.set_metadata("model", cap.model);
    }
    for (const auto & [k, val] : extra_metadata) {
        w.set_metadata(k, val);
    }
    w.write(path);
}

}  // namespace ecokv
