// The entry format of ecokv/llama-entry.h.
#include "ecokv/llama-entry.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace ecokv::llama {

namespace {

constexpr char k_magic[8] = { 'E', 'C', 'O', 'K', 'V', 'E', 'N', 'T' };

struct writer {
    std::vector<uint8_t> out;
    template <typename T> void put(T v) {
        static_assert(std::is_trivially_copyable_v<T>);
        const auto * p = reinterpret_cast<const uint8_t *>(&v);  // little-endian hosts only (x86, arm64)
        out.insert(out.end(), p, p + sizeof(T));
    }
    template <typename T> void put_array(const std::vector<T> & a) {
        put<uint64_t>(a.size());
        const auto * p = reinterpret_cast<const uint8_t *>(a.data());
        if (!a.empty()) {
            out.insert(out.end(), p, p + a.size() * sizeof(T));
        }
    }
    template <typename T> void put_arrays(const std::vector<std::vector<T>> & a) {
        put<uint64_t>(a.size());
        for (const auto & x : a) {
            put_array(x);
        }
    }
    void put_string(const std::string & s) { put_array(std::vector<char>(s.begin(), s.end())); }
};

struct reader {
    std::span<const uint8_t> in;
    size_t                   at = 0;
    [[noreturn]] static void fail(const std::string & what) {
        throw entry_error(entry_fault::malformed, "the entry is malformed: " + what);
    }
    template <typename T> T get(const char * what) {
        if (in.size() - at < sizeof(T)) {
            fail(std::string(what) + " runs past the end");
        }
        T v;
        std::memcpy(&v, in.data() + at, sizeof(T));
        at += sizeof(T);
        return v;
    }
    template <typename T> std::vector<T> get_array(const char * what) {
        const uint64_t n = get<uint64_t>(what);
        if (n > (in.size() - at) / sizeof(T)) {  // never trust a length: bounded by the bytes left
            fail(std::string(what) + " claims " + std::to_string(n) + " elements, more than the entry holds");
        }
        std::vector<T> a(static_cast<size_t>(n));
        if (n > 0) {
            std::memcpy(a.data(), in.data() + at, size_t(n) * sizeof(T));
        }
        at += size_t(n) * sizeof(T);
        return a;
    }
    template <typename T> std::vector<std::vector<T>> get_arrays(const char * what) {
        const uint64_t n = get<uint64_t>(what);
        if (n > (in.size() - at) / sizeof(uint64_t)) {  // each array takes its count at least
            fail(std::string(what) + " claims " + std::to_string(n) + " arrays, more than the entry holds");
        }
        std::vector<std::vector<T>> a;
        for (uint64_t i = 0; i < n; ++i) {
            a.push_back(get_array<T>(what));
        }
        return a;
    }
    std::string get_string(const char * what) {
        const std::vector<char> c = get_array<char>(what);
        return { c.begin(), c.end() };
    }
};

}  // namespace

std::vector<uint8_t> encode_entry(const entry & e) {
    writer w;
    w.out.insert(w.out.end(), k_magic, k_magic + sizeof(k_magic));
    w.put(k_entry_version);
    w.put(e.header.model_fingerprint);
    w.put_string(e.header.cache_shape);
    w.put_string(e.header.compression_key);
    w.put(e.role);
    w.put(e.kv_bytes_full);
    w.put_array(e.units);
    const snapshot & s = e.snap;
    w.put_array(s.state);
    w.put_array(s.layout);
    w.put_arrays(s.kept_cells);
    w.put_arrays(s.kept_modality);
    w.put_arrays(s.kept_accumulated);
    w.put(s.cells_seen);
    w.put_array(s.decoded_modality);
    w.put_array(s.logits);
    w.put<uint8_t>(s.own_logits);
    w.put(s.n_cells);
    w.put(s.n_past);
    w.put(s.kv_bytes_kept);
    w.put<uint64_t>(XXH3_64bits(w.out.data(), w.out.size()));
    return std::move(w.out);
}

entry decode_entry(std::span<const uint8_t> bytes) {
    if (bytes.size() < sizeof(k_magic) + sizeof(uint32_t) + sizeof(uint64_t) ||
        std::memcmp(bytes.data(), k_magic, sizeof(k_magic)) != 0) {
        throw entry_error(bytes.size() < sizeof(k_magic) ? entry_fault::truncated : entry_fault::malformed,
                          "not an ecokv entry (" + std::to_string(bytes.size()) + " bytes, no magic)");
    }
    const size_t body = bytes.size() - sizeof(uint64_t);
    uint64_t     sum  = 0;
    std::memcpy(&sum, bytes.data() + body, sizeof(sum));
    if (XXH3_64bits(bytes.data(), body) != sum) {
        throw entry_error(entry_fault::corrupted, "the entry's checksum does not match (truncated or corrupted)");
    }
    reader r{ bytes.first(body) };
    r.at = sizeof(k_magic);
    if (const auto v = r.get<uint32_t>("version"); v != k_entry_version) {
        throw entry_error(entry_fault::version, "entry format version " + std::to_string(v) + ", this build reads " +
                                                    std::to_string(k_entry_version));
    }
    entry e;
    e.header.model_fingerprint = r.get<uint64_t>("fingerprint");
    e.header.cache_shape       = r.get_string("cache shape");
    e.header.compression_key   = r.get_string("compression key");
    const auto role            = r.get<uint8_t>("role");
    if (role > uint8_t(entry_role::context)) {
        reader::fail("unknown role " + std::to_string(role));
    }
    e.role          = entry_role(role);
    e.kv_bytes_full = r.get<uint64_t>("full-cache bytes");
    e.units                    = r.get_array<uint64_t>("units");
    snapshot & s               = e.snap;
    s.state                    = r.get_array<uint8_t>("state");
    s.layout                   = r.get_array<uint32_t>("layout");
    s.kept_cells               = r.get_arrays<int32_t>("kept cells");
    s.kept_modality            = r.get_arrays<uint8_t>("kept modality");
    s.kept_accumulated         = r.get_arrays<float>("kept attention");
    s.cells_seen       = r.get<int32_t>("cells_seen");
    s.decoded_modality = r.get_array<uint8_t>("decoded modality");
    s.logits           = r.get_array<float>("logits");
    s.own_logits       = r.get<uint8_t>("own_logits") != 0;
    s.n_cells          = r.get<int32_t>("n_cells");
    s.n_past           = r.get<llama_pos>("n_past");
    s.kv_bytes_kept    = r.get<uint64_t>("kv_bytes_kept");
    if (r.at != body) {
        reader::fail(std::to_string(body - r.at) + " bytes after the snapshot");
    }
    if (!s.layout.empty() && s.kept_cells.size() != s.layout.size()) {
        reader::fail("the kept cells do not match the layout");
    }
    for (size_t i = 0; i < s.kept_cells.size() && !s.layout.empty(); ++i) {
        if (s.kept_cells[i].size() != s.layout[i] ||
            (i < s.kept_modality.size() && s.kept_modality[i].size() != s.kept_cells[i].size())) {
            reader::fail("head " + std::to_string(i) + "'s kept cells do not match the layout");
        }
    }
    if (s.n_cells <= 0 || s.state.empty() || s.logits.empty()) {
        reader::fail("an empty snapshot");
    }
    return e;
}

entry decode_entry_for(std::span<const uint8_t> bytes, const entry_header & expected) {
    entry e = decode_entry(bytes);
    if (e.header.model_fingerprint != expected.model_fingerprint) {
        throw entry_error(entry_fault::foreign_model, "the entry was made by another model (fingerprint " +
                                                          std::to_string(e.header.model_fingerprint) + ")");
    }
    if (e.header.cache_shape != expected.cache_shape) {
        throw entry_error(entry_fault::other_shape, "the entry's cache is shaped otherwise: '" + e.header.cache_shape +
                                                        "', this session's '" + expected.cache_shape + "'");
    }
    return e;
}

}  // namespace ecokv::llama
