// ecokv: a small safetensors reader and writer (the Hugging Face format).
#pragma once

#include "ecokv/tensor.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ecokv {

struct safetensors_tensor {
    std::string          name;
    dtype                type = dtype::f32;
    std::vector<int64_t> shape;  // outermost first
    std::span<const std::byte> bytes;

    tensor_view view() const;  // packed view of `bytes` with `shape`
};

// Read side: the file is memory-mapped; tensors point into the mapping, which lives as long as any copy.
// open() validates the header length, the JSON, every dtype, shape and offset range, overlap of data
// ranges and the total file size, and throws ecokv::error("FILE: reason") on the first problem.
class safetensors_file {
  public:
    static safetensors_file open(const std::string & path);

    const std::string &                        path() const { return path_; }
    const std::vector<safetensors_tensor> &    tensors() const { return tensors_; }
    const std::map<std::string, std::string> & metadata() const { return metadata_; }

    const safetensors_tensor * find(const std::string & name) const;  // nullptr when absent

  private:
    std::shared_ptr<const void>        mapping_;
    std::string                        path_;
    std::vector<safetensors_tensor>    tensors_;
    std::map<std::string, std::string> metadata_;
};

// Write side: collect tensors, then write() atomically (temporary file + rename).
class safetensors_writer {
  public:
    void set_metadata(const std::string & key, const std::string & value) { metadata_[key] = value; }

    // Copies the data of `view` (any strides) as a packed tensor of shape ne[3..0] with trailing unit
    // dimensions dropped down to `n_dims`. Encoded rows (an engine's quantized blocks) are written decoded, as F32.
    void add(const std::string & name, const tensor_view & view, int n_dims);
    void add(const std::string & name, dtype type, std::vector<int64_t> shape, std::vector<std::byte> bytes);

    void write(const std::string & path) const;

  private:
    struct entry {
        std::string            name;
        dtype                  type;
        std::vector<int64_t>   shape;
        std::vector<std::byte> bytes;
    };
    std::vector<entry>                 entries_;
    std::map<std::string, std::string> metadata_;
};

// Writes `contents` to `path` through a temporary file in the same directory, renamed into
// place only after a successful flush. Shared by every writer of the project.
void write_file_atomic(const std::string & path, const std::string & contents);

// Several files (path, contents) as one: each written to its temporary file first, all renamed into place only
// once every one is whole, so a failure (a full disk) leaves none of them new.
void write_files_atomic(const std::vector<std::pair<std::string, std::string>> & files);

}  // namespace ecokv
