// Realistic random captures. Every random stream is keyed by (seed, layer, head, purpose[, token]) so the
// bytes do not depend on the generation order.
#include "ecokv/synth.h"

#include "impl.h"
#include "kernels/hash.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ecokv {

namespace {

constexpr auto mix = kernels::splitmix64;

// splitmix64 stream with Box-Muller normals: portable, unlike std::normal_distribution.
class rng {
  public:
    rng(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d = 0) :
        state_(mix(mix(mix(mix(seed) ^ a) ^ b) ^ c) ^ d) {}
    double uniform() { return double(mix(state_++) >> 11) * 0x1p-53; }
    double normal() {
        const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    int32_t below(int32_t n) { return int32_t(uniform() * n); }

  private:
    uint64_t state_;
};

enum stream : uint64_t { s_channels, s_keys, s_values, s_queries, s_salient };

std::vector<double> random_unit(rng & r, int32_t d) {
    std::vector<double> v(static_cast<size_t>(d));
    double              n2 = 0;
    for (double & x : v) {
        x = r.normal();
        n2 += x * x;
    }
    for (double & x : v) {
        x /= std::sqrt(n2);
    }
    return v;
}

// NeoX-style rotary embedding of one row at position `pos` (pairs i, i + d/2).
void rope(std::vector<double> & x, int32_t pos) {
    const int32_t half = int32_t(x.size()) / 2;
    for (int32_t i = 0; i < half; ++i) {
        const double theta = pos * std::pow(10000.0, -2.0 * i / double(x.size()));
        const double c = std::cos(theta), s = std::sin(theta);
        const double a = x[i], b = x[i + half];
        x[i]        = a * c - b * s;
        x[i + half] = a * s + b * c;
    }
}

void store(std::vector<std::byte> & buf, size_t index, dtype type, double v) {
    if (type == dtype::f32) {
        const float f = float(v);
        std::memcpy(buf.data() + index * 4, &f, 4);
    } else {
        const uint16_t h = f32_to_f16(float(v));
        std::memcpy(buf.data() + index * 2, &h, 2);
    }
}

// Post-RoPE keys and values of one KV head: [n_tokens][head_dim] and [n_tokens][head_dim_v].
void make_head(const synth_params & p, const std::vector<uint8_t> & modality, int32_t il, int32_t ig,
               std::vector<std::vector<double>> & keys, std::vector<std::vector<double>> & values) {
    const int32_t d = p.head_dim, dv = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
    rng           rc(p.seed, s_channels, il, ig);
    std::vector<double> sigma(static_cast<size_t>(d));
    for (double & s : sigma) {
        s = std::exp(0.5 * rc.normal());
    }
    sigma[size_t(rc.below(d))] *= 4.0;  // outlier channels, as seen in real key caches
    sigma[size_t(rc.below(d))] *= 3.0;
    // Layers differ in how anisotropic their keys are (redundancy varies with depth).
    const double        anisotropy = 0.6 + 2.4 * std::fabs(std::sin(1.3 * il + 0.7 * ig));
    std::vector<double> text_dir = random_unit(rc, d), image_dir = random_unit(rc, d);
    for (int32_t i = 0; i < d; ++i) {
        image_dir[i] = 0.6 * text_dir[i] + 0.8 * image_dir[i];
    }
    const double scale = std::sqrt(double(d));
    rng          rk(p.seed, s_keys, il, ig), rv(p.seed, s_values, il, ig);
    std::vector<double> ar(static_cast<size_t>(d), 0.0);  // AR(1) state: neighbouring image tokens look alike
    keys.assign(size_t(p.n_tokens), {});
    values.assign(size_t(p.n_tokens), {});
    for (int32_t t = 0; t < p.n_tokens; ++t) {
        const bool   image = modality[t] != 0;
        const double norm  = std::exp(0.35 * rk.normal()) * (t == 0 ? 3.0 : 1.0);  // token 0: attention sink
        std::vector<double> k(static_cast<size_t>(d));
        for (int32_t i = 0; i < d; ++i) {
            const double z = rk.normal();
            ar[i]          = image ? 0.8 * ar[i] + 0.6 * z : z;
            const double dir = image ? image_dir[i] : text_dir[i];
            k[i]             = norm * 1.5 * (anisotropy * scale * dir + sigma[i] * ar[i]);
        }
        rope(k, t);
        keys[t] = std::move(k);
        std::vector<double> v(static_cast<size_t>(dv));
        const double        vnorm = std::exp(0.5 * rv.normal());
        for (double & x : v) {
            x = vnorm * rv.normal();
        }
        values[t] = std::move(v);
    }
}

// Post-RoPE query of head h at position pos: aimed at a few salient earlier tokens (shared by the group and
// per head), recent tokens and the sink, plus noise; logits of salient tokens sit a few units above the rest.
std::vector<double> make_query(const synth_params & p, const std::vector<std::vector<double>> & keys, int32_t il,
                               int32_t h, int32_t group, int32_t pos) {
    const int32_t d = p.head_dim;
    rng           shared(p.seed, s_salient, il, h / group), own(p.seed, s_salient, il, 1000 + h);
    rng           noise(p.seed, s_queries, il, h, uint64_t(pos));
    std::vector<std::pair<int32_t, double>> targets = { { 0, 0.8 } };
    for (int32_t i = 0; i < 4; ++i) {
        targets.push_back({ shared.below(pos + 1), 1.0 + 0.5 * i });
        targets.push_back({ own.below(pos + 1), 0.7 });
    }
    targets.push_back({ std::max(0, pos - 1), 0.9 });
    targets.push_back({ pos, 0.6 });
    std::vector<double> q(static_cast<size_t>(d));
    for (double & x : q) {
        x = 0.5 * noise.normal();
    }
    for (const auto & [t, w] : targets) {
        double n2 = 0;
        for (double x : keys[t]) {
            n2 += x * x;
        }
        for (int32_t i = 0; i < d; ++i) {
            q[i] += w * 2.5 * std::sqrt(double(d)) * keys[t][i] / std::max(n2, 1e-9);
        }
    }
    return q;
}

}  // namespace

void synth_params::validate() const {
    auto positive = [](const char * name, int64_t v) {
        if (v <= 0) {
            ECOKV_THROW("%s %lld must be positive", name, (long long) v);
        }
    };
    positive("--layers", n_layers);
    positive("--heads", n_heads);
    positive("--kv-heads", n_kv_heads);
    positive("--head-dim", head_dim);
    positive("--tokens", n_tokens);
    positive("--queries", n_queries);
    if (head_dim % 2 != 0) {
        ECOKV_THROW("--head-dim %d must be even (RoPE rotates pairs)", head_dim);
    }
    if (n_heads % n_kv_heads != 0) {
        ECOKV_THROW("--heads %d must be a multiple of --kv-heads %d", n_heads, n_kv_heads);
    }
    if (n_queries > n_tokens) {
        ECOKV_THROW("--queries %d exceeds --tokens %d", n_queries, n_tokens);
    }
    if (type == dtype::u8) {
        ECOKV_THROW("--dtype must be f32 or f16");
    }
    // The capture is built in memory: bounded before anything is allocated (2^32 values: 16 GiB in F32).
    const int64_t dv     = head_dim_v > 0 ? head_dim_v : head_dim;
    const double  values = double(n_layers) * (double(n_kv_heads) * n_tokens * (head_dim + dv) +
                                              double(n_heads) * (n_queries + (full_queries ? n_tokens : 0)) * head_dim);
    if (values > 4294967296.0) {
        ECOKV_THROW("the capture would hold %.3g values (--layers x --tokens x heads x head_dim), more than 2^32", values);
    }
    for (const auto & [b, e] : image_spans) {
        if (b < 0 || e > n_tokens || b >= e) {
            ECOKV_THROW("--image-tokens %d:%d must satisfy 0 <= a < b <= --tokens %d", b, e, n_tokens);
        }
    }
}

owned_capture make_synth_capture(const synth_params & p) {
    p.validate();
    const int32_t d = p.head_dim, dv = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
    const int32_t group = p.n_heads / p.n_kv_heads;
    const size_t  es    = dtype_size(p.type);

    owned_capture  out;
    capture_view & v = out.view_;
    v.n_layers = p.n_layers, v.n_heads = p.n_heads, v.n_kv_heads = p.n_kv_heads;
    v.head_dim = d, v.head_dim_v = dv, v.n_tokens = p.n_tokens, v.n_queries = p.n_queries;
    v.model    = "synthetic";
    std::vector<uint8_t> modality(size_t(p.n_tokens), 0);
    for (const auto & [b, e] : p.image_spans) {
        std::fill(modality.begin() + b, modality.begin() + e, uint8_t(1));
    }
    if (!p.image_spans.empty()) {
        v.modality = modality;
    }
    out.storage_.reserve(size_t(p.n_layers) * 4);
    for (int32_t il = 0; il < p.n_layers; ++il) {
        auto & kb = out.storage_.emplace_back(size_t(p.n_kv_heads) * p.n_tokens * d * es);
        auto & vb = out.storage_.emplace_back(size_t(p.n_kv_heads) * p.n_tokens * dv * es);
        auto & qb = out.storage_.emplace_back(size_t(p.n_heads) * p.n_queries * d * es);
        auto & fb = out.storage_.emplace_back(p.full_queries ? size_t(p.n_heads) * p.n_tokens * d * es : 0);
        for (int32_t ig = 0; ig < p.n_kv_heads; ++ig) {
            std::vector<std::vector<double>> keys, values;
            make_head(p, modality, il, ig, keys, values);
            for (int32_t t = 0; t < p.n_tokens; ++t) {
                for (int32_t i = 0; i < d; ++i) {
                    store(kb, (size_t(ig) * p.n_tokens + t) * d + i, p.type, keys[t][i]);
                }
                for (int32_t i = 0; i < dv; ++i) {
                    store(vb, (size_t(ig) * p.n_tokens + t) * dv + i, p.type, values[t][i]);
                }
            }
            for (int32_t h = ig * group; h < (ig + 1) * group; ++h) {
                const int32_t first = p.full_queries ? 0 : p.n_tokens - p.n_queries;
                for (int32_t pos = first; pos < p.n_tokens; ++pos) {
                    const std::vector<double> q   = make_query(p, keys, il, h, group, pos);
                    const int32_t             row = pos - (p.n_tokens - p.n_queries);
                    for (int32_t i = 0; i < d; ++i) {
                        if (row >= 0) {
                            store(qb, (size_t(h) * p.n_queries + row) * d + i, p.type, q[i]);
                        }
                        if (p.full_queries) {
                            store(fb, (size_t(h) * p.n_tokens + pos) * d + i, p.type, q[i]);
                        }
                    }
                }
            }
        }
        layer_capture lc;
        lc.keys    = tensor_view::packed(kb.data(), p.type, { p.n_kv_heads, p.n_tokens, d });
        lc.values  = tensor_view::packed(vb.data(), p.type, { p.n_kv_heads, p.n_tokens, dv });
        lc.queries = tensor_view::packed(qb.data(), p.type, { p.n_heads, p.n_queries, d });
        if (p.full_queries) {
            lc.full_queries = tensor_view::packed(fb.data(), p.type, { p.n_heads, p.n_tokens, d });
        }
        v.layers.push_back(lc);
    }
    return out;
}

}  // namespace ecokv
