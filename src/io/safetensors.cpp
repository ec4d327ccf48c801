// Safetensors (https://huggingface.co/docs/safetensors): 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the raw data.
#include "ecokv/safetensors.h"

#include "impl.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace ecokv {

namespace {

using json = nlohmann::json;

constexpr uint64_t k_max_header = 100u << 20;  // the reference implementation's limit

bool parse_dtype(const std::string & s, dtype & out) {
    for (dtype t : { dtype::f32, dtype::f16, dtype::u8 }) {
        if (s == dtype_name(t)) {
            out = t;
            return true;
        }
    }
    return false;
}

std::shared_ptr<const void> map_file(const std::string & path, size_t & size) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ECOKV_THROW("%s: cannot open: %s", path.c_str(), std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        ECOKV_THROW("%s: not a regular file", path.c_str());
    }
    size = size_t(st.st_size);
    if (size == 0) {
        ::close(fd);
        ECOKV_THROW("%s: file is empty, expected a safetensors header", path.c_str());
    }
    void * addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (addr == MAP_FAILED) {
        ECOKV_THROW("%s: mmap failed: %s", path.c_str(), std::strerror(errno));
    }
    return std::shared_ptr<const void>(addr, [size](const void * p) { ::munmap(const_cast<void *>(p), size); });
}

}  // namespace

tensor_view safetensors_tensor::view() const {
    tensor_view v;
    v.data = bytes.data();
    v.type = type;
    v.ne   = { 1, 1, 1, 1 };  // a scalar (shape []) holds one element
    for (size_t d = 0; d < shape.size() && d < 4; ++d) {
        v.ne[d] = shape[shape.size() - 1 - d];
    }
    v.nb[0] = dtype_size(type);
    for (int d = 1; d < 4; ++d) {
        v.nb[d] = v.nb[d - 1] * size_t(v.ne[d - 1]);
    }
    return v;
}

safetensors_file safetensors_file::open(const std::string & path) {
    safetensors_file f;
    f.path_       = path;
    size_t size   = 0;
    f.mapping_    = map_file(path, size);
    const auto * base = static_cast<const std::byte *>(f.mapping_.get());
    if (size < 8) {
        ECOKV_THROW("%s: truncated: %zu bytes, shorter than the 8-byte header length", path.c_str(), size);
    }
    uint64_t n_header = 0;
    for (int i = 7; i >= 0; --i) {
        n_header = (n_header << 8) | uint64_t(base[i]);
    }
    if (n_header > k_max_header || n_header > size - 8) {
        ECOKV_THROW("%s: header length %llu exceeds the file size %zu (truncated or not safetensors)",
                    path.c_str(), (unsigned long long) n_header, size);
    }
    const char * text = reinterpret_cast<const char *>(base + 8);
    json         header;
    try {
        header = json::parse(text, text + n_header);
    } catch (const json::exception & e) {
        ECOKV_THROW("%s: header is not valid JSON: %s", path.c_str(), e.what());
    }
    if (!header.is_object()) {
        ECOKV_THROW("%s: header is not a JSON object", path.c_str());
    }
    const std::byte * data   = base + 8 + n_header;
    const uint64_t    n_data = size - 8 - n_header;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto & [name, entry] : header.items()) {
        const char * cname = name.c_str();
        if (name == "__metadata__") {
            if (!entry.is_object()) {
                ECOKV_THROW("%s: __metadata__ is not an object", path.c_str());
            }
            for (const auto & [key, value] : entry.items()) {
                if (!value.is_string()) {
                    ECOKV_THROW("%s: __metadata__[\"%s\"] is not a string", path.c_str(), key.c_str());
                }
                f.metadata_[key] = value.get<std::string>();
            }
            continue;
        }
        if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
            !entry.contains("data_offsets")) {
            ECOKV_THROW("%s: tensor '%s' needs dtype, shape and data_offsets", path.c_str(), cname);
        }
        safetensors_tensor t;
        t.name = name;
        if (!entry["dtype"].is_string() || !parse_dtype(entry["dtype"].get<std::string>(), t.type)) {
            ECOKV_THROW("%s: tensor '%s' has unsupported dtype %s (supported: F32, F16, U8)", path.c_str(), cname,
                        entry["dtype"].dump().c_str());
        }
        const json & shape = entry["shape"];
        if (!shape.is_array() || shape.size() > 4) {
            ECOKV_THROW("%s: tensor '%s' shape must be an array of at most 4 dimensions", path.c_str(), cname);
        }
        uint64_t n_elements = 1;
        bool     too_large  = false;  // the element count overflows (harmless when a dimension is 0)
        bool     has_zero   = false;
        for (const json & d : shape) {
            if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 40)) {
                ECOKV_THROW("%s: tensor '%s' has an invalid dimension %s", path.c_str(), cname, d.dump().c_str());
            }
            t.shape.push_back(int64_t(d.get<uint64_t>()));
            too_large = __builtin_mul_overflow(n_elements, d.get<uint64_t>(), &n_elements) || too_large;
            has_zero  = has_zero || d.get<uint64_t>() == 0;
        }
        if (!has_zero && (too_large || n_elements > (UINT64_MAX / 8))) {
            ECOKV_THROW("%s: tensor '%s' shape %s is too large", path.c_str(), cname, shape.dump().c_str());
        }
        const json & offsets = entry["data_offsets"];
        if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
            !offsets[1].is_number_unsigned()) {
            ECOKV_THROW("%s: tensor '%s' data_offsets must be [begin, end]", path.c_str(), cname);
        }
        const uint64_t begin = offsets[0].get<uint64_t>();
        const uint64_t end   = offsets[1].get<uint64_t>();
        if (begin > end || end > n_data) {
            ECOKV_THROW("%s: tensor '%s' data_offsets [%llu, %llu] lie outside the %llu data bytes (truncated file?)",
                        path.c_str(), cname, (unsigned long long) begin, (unsigned long long) end,
                        (unsigned long long) n_data);
        }
        if (end - begin != n_elements * dtype_size(t.type)) {
            ECOKV_THROW("%s: tensor '%s' holds %llu bytes but its shape and dtype need %llu", path.c_str(), cname,
                        (unsigned long long) (end - begin), (unsigned long long) (n_elements * dtype_size(t.type)));
        }
        t.bytes = { data + begin, size_t(end - begin) };
        ranges.emplace_back(begin, end);
        f.tensors_.push_back(std::move(t));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
        if (ranges[i].first < ranges[i - 1].second) {
            ECOKV_THROW("%s: tensor data ranges overlap", path.c_str());
        }
    }
    return f;
}

const safetensors_tensor * safetensors_file::find(const std::string & name) const {
    for (const auto & t : tensors_) {
        if (t.name == name) {
            return &t;
        }
    }
    return nullptr;
}

void safetensors_writer::add(const std::string & name, dtype type, std::vector<int64_t> shape,
                             std::vector<std::byte> bytes) {
    entries_.push_back({ name, type, std::move(shape), std::move(bytes) });
}

void safetensors_writer::add(const std::string & name, const tensor_view & view, int n_dims) {
    ECOKV_ASSERT(n_dims >= 1 && n_dims <= 4);
    std::vector<int64_t> shape;
    for (int d = n_dims - 1; d >= 0; --d) {
        shape.push_back(view.ne[d]);
    }
    // safetensors has no engine block types: encoded rows are written decoded, as F32
    const bool             decode    = view.type == dtype::encoded;
    const dtype            type      = decode ? dtype::f32 : view.type;
    const size_t           row_bytes = size_t(view.ne[0]) * dtype_size(type);
    std::vector<std::byte> bytes(size_t(view.n_elements()) * dtype_size(type));
    std::byte *            out = bytes.data();
    for (int64_t i3 = 0; i3 < view.ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < view.ne[2]; ++i2) {
            for (int64_t i1 = 0; i1 < view.ne[1]; ++i1) {
                if (decode) {
                    view.codec->to_f32(view.row(i1, i2, i3), reinterpret_cast<float *>(out), view.ne[0]);
                } else {
                    std::memcpy(out, view.row(i1, i2, i3), row_bytes);
                }
                out += row_bytes;
            }
        }
    }
    add(name, type, std::move(shape), std::move(bytes));
}

void safetensors_writer::write(const std::string & path) const {
    json     header = json::object();
    uint64_t offset = 0;
    for (const auto & e : entries_) {
        header[e.name] = { { "dtype", dtype_name(e.type) },
                           { "shape", e.shape },
                           { "data_offsets", { offset, offset + e.bytes.size() } } };
        offset += e.bytes.size();
    }
    if (!metadata_.empty()) {
        header["__metadata__"] = metadata_;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
    std::string out;
    out.reserve(8 + text.size() + offset);
    for (int i = 0; i < 8; ++i) {
        out.push_back(char((uint64_t(text.size()) >> (8 * i)) & 0xff));
    }
    out += text;
    for (const auto & e : entries_) {
        out.append(reinterpret_cast<const char *>(e.bytes.data()), e.bytes.size());
    }
    write_file_atomic(path, out);
}

namespace {

// `contents` written to a new temporary file beside `path`; returns its name. Nothing is left on failure.
std::string write_temporary(const std::string & path, const std::string & contents) {
    namespace fs = std::filesystem;
    const fs::path target(path);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    std::string    tmpl = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
    const int      fd   = ::mkstemp(tmpl.data());
    if (fd < 0) {
        ECOKV_THROW("%s: cannot create a file in %s: %s", path.c_str(), dir.c_str(), std::strerror(errno));
    }
    size_t done = 0;
    while (done < contents.size()) {
        const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            const int err = errno;
            ::close(fd);
            ::unlink(tmpl.c_str());
            ECOKV_THROW("%s: write failed: %s", path.c_str(), std::strerror(err));
        }
        done += size_t(n);
    }
    ::fchmod(fd, 0644);
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmpl.c_str());
        ECOKV_THROW("%s: cannot write: %s", path.c_str(), std::strerror(err));
    }
    return tmpl;
}

}  // namespace

void write_file_atomic(const std::string & path, const std::string & contents) {
    write_files_atomic({ { path, contents } });
}

void write_files_atomic(const std::vector<std::pair<std::string, std::string>> & files) {
    std::vector<std::string> temporaries;
    try {
        for (const auto & [path, contents] : files) {
            temporaries.push_back(write_temporary(path, contents));
        }
    } catch (const error &) {
        for (const std::string & t : temporaries) {
            ::unlink(t.c_str());
        }
        throw;
    }
    // Every file is whole on disk; renames need no space.
    for (size_t i = 0; i < files.size(); ++i) {
        if (std::rename(temporaries[i].c_str(), files[i].first.c_str()) != 0) {
            const int err = errno;
            for (size_t j = i; j < files.size(); ++j) {
                ::unlink(temporaries[j].c_str());
            }
            ECOKV_THROW("%s: cannot write: %s", files[i].first.c_str(), std::strerror(err));
        }
    }
}

}  // namespace ecokv
