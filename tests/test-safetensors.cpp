// safetensors reading/writing (good and corrupt files) and atomic writes.
//
// Expected values are computed independently of the code under test: bytes assembled by hand for safetensors
// files, nlohmann::json for parsing what we write.
#include "ecokv/ecokv.h"

#include "test-io-util.h"
#include "test-util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace ecokv::test;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------------------------
// helpers

// A safetensors file assembled by hand: 8-byte little-endian header length, header text, data.
std::string safetensors_bytes(const std::string & header, const std::string & data) {
    std::string out;
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) {
        out.push_back(char((n >> (8 * i)) & 0xff));
    }
    return out + header + data;
}

template <typename T> std::vector<std::byte> to_bytes(const std::vector<T> & v) {
    std::vector<std::byte> out(v.size() * sizeof(T));
    std::memcpy(out.data(), v.data(), out.size());
    return out;
}

std::string bytes_str(std::span<const std::byte> b) {
    return std::string(reinterpret_cast<const char *>(b.data()), b.size());
}

// ---------------------------------------------------------------------------------------------------------------
// safetensors

TEST(safetensors, round_trip) {
    temp_dir                dir;
    const std::string       path = dir / "a.safetensors";
    const std::vector<float> f32 = { 1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f };
    const std::vector<uint16_t> f16 = { 0x3c00, 0xc000, 0x7bff, 0x0001 };
    const std::vector<uint8_t>  u8  = { 0, 1, 2, 250, 255, 7 };
    // A strided source: a [2][3] view taking every other float of a 12-float buffer row-wise.
    std::vector<float> wide(2 * 6);
    for (size_t i = 0; i < wide.size(); ++i) {
        wide[i] = float(i) * 0.5f;
    }
    ecokv::tensor_view strided;
    strided.data = wide.data();
    strided.type = ecokv::dtype::f32;
    strided.ne   = { 3, 2, 1, 1 };
    strided.nb   = { 4, 24, 48, 48 };

    ecokv::safetensors_writer w;
    w.add("f32", ecokv::dtype::f32, { 2, 3 }, to_bytes(f32));
    w.add("half", ecokv::dtype::f16, { 4 }, to_bytes(f16));
    w.add("bytes", ecokv::dtype::u8, { 3, 1, 2 }, to_bytes(u8));
    w.add("view", strided, 2);
    w.set_metadata("model", "unit-test");
    w.set_metadata("n", "42");
    w.write(path);

    // The file, read by hand: header length is a multiple of 8 and the data follows it exactly.
    const std::string file     = read_file(path);
    const uint64_t    n_header = header_length_of(file);
    EXPECT_EQ(n_header % 8, 0u);
    const size_t n_data = 4 * 6 + 2 * 4 + 6 + 4 * 6;
    ASSERT_EQ(file.size(), 8 + n_header + n_data);
    const json header = json::parse(file.substr(8, n_header));
    EXPECT_EQ(header["__metadata__"], (json{ { "model", "unit-test" }, { "n", "42" } }));
    EXPECT_EQ(header["f32"]["dtype"], "F32");
    EXPECT_EQ(header["f32"]["shape"], (json{ 2, 3 }));
    EXPECT_EQ(header["half"]["dtype"], "F16");
    EXPECT_EQ(header["bytes"]["dtype"], "U8");
    EXPECT_EQ(header["bytes"]["shape"], (json{ 3, 1, 2 }));
    EXPECT_EQ(header["view"]["shape"], (json{ 2, 3 }));
    auto data_of = [&](const char * name) {
        const uint64_t b = header[name]["data_offsets"][0], e = header[name]["data_offsets"][1];
        return file.substr(8 + n_header + b, e - b);
    };
    EXPECT_EQ(data_of("f32"), raw(f32));
    EXPECT_EQ(data_of("half"), raw(f16));
    EXPECT_EQ(data_of("bytes"), raw(u8));
    EXPECT_EQ(data_of("view"), raw(std::vector<float>{ 0.0f, 0.5f, 1.0f, 3.0f, 3.5f, 4.0f }));

    // The same, through our reader.
    const auto f = ecokv::safetensors_file::open(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.tensors().size(), 4u);
    EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{ { "model", "unit-test" }, { "n", "42" } }));
    const auto * t = f.find("f32");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, ecokv::dtype::f32);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{ 2, 3 }));
    EXPECT_EQ(bytes_str(t->bytes), raw(f32));
    const auto tv = t->view();
    EXPECT_EQ(tv.ne, (std::array<int64_t, 4>{ 3, 2, 1, 1 }));
    EXPECT_EQ(tv.nb, (std::array<size_t, 4>{ 4, 12, 24, 24 }));
    float row[3];
    tv.row_f32(1, 0, row);
    EXPECT_EQ(row[0], 0.0f);
    EXPECT_EQ(row[2], 1e-30f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->bytes.data()) % 4, 0u);  // 8-aligned header keeps data aligned
    t = f.find("half");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, ecokv::dtype::f16);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{ 4 }));
    EXPECT_EQ(bytes_str(t->bytes), raw(f16));
    t = f.find("bytes");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, ecokv::dtype::u8);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{ 3, 1, 2 }));
    EXPECT_EQ(bytes_str(t->bytes), raw(u8));
    EXPECT_EQ(t->view().ne, (std::array<int64_t, 4>{ 2, 1, 3, 1 }));
    EXPECT_EQ(f.find("missing"), nullptr);
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "a.safetensors" }));
}

TEST(safetensors, header_padding_for_every_length) {
    // Tensor names of growing length move the header size through every residue mod 8.
    temp_dir dir;
    for (int n = 1; n <= 16; ++n) {
        ecokv::safetensors_writer w;
        w.add(std::string(size_t(n), 'x'), ecokv::dtype::u8, { 3 }, to_bytes(std::vector<uint8_t>{ 1, 2, 3 }));
        const std::string path = dir / ("p" + std::to_string(n) + ".safetensors");
        w.write(path);
        const std::string file = read_file(path);
        const uint64_t    nh   = header_length_of(file);
        EXPECT_EQ(nh % 8, 0u) << n;
        ASSERT_EQ(file.size(), 8 + nh + 3) << n;
        EXPECT_EQ(file.substr(8 + nh), std::string("\x01\x02\x03", 3));
        EXPECT_NO_THROW(json::parse(file.substr(8, nh))) << n;
        const auto f = ecokv::safetensors_file::open(path);
        ASSERT_EQ(f.tensors().size(), 1u);
        EXPECT_EQ(f.tensors()[0].name, std::string(size_t(n), 'x'));
        EXPECT_TRUE(f.metadata().empty());
    }
}

TEST(safetensors, reads_a_file_written_by_hand) {
    temp_dir dir;
    // Header of odd length (not padded), data of "b" stored before "a", a scalar, a zero-size tensor and
    // extra keys in __metadata__.
    const std::string header =
        R"({"a":{"dtype":"F16","shape":[2,2],"data_offsets":[8,16]},)"
        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
        R"("s":{"dtype":"U8","shape":[],"data_offsets":[16,17]},)"
        R"("z":{"dtype":"F32","shape":[0,3],"data_offsets":[17,17]},)"
        R"("__metadata__":{"format":"pt","k":"v w"}})";
    std::string data;
    const float b[2] = { 2.5f, -1.0f };  // 0x40200000, 0xbf800000
    data.append(reinterpret_cast<const char *>(b), 8);
    // a = [[1, -2], [65504, 2^-24]] in half: 0x3c00 0xc000 0x7bff 0x0001, little-endian.
    data.append("\x00\x3c\x00\xc0\xff\x7b\x01\x00", 8);
    data.push_back('\x2a');
    const std::string path = dir / "hand.safetensors";
    write_file(path, safetensors_bytes(header, data));

    const auto f = ecokv::safetensors_file::open(path);
    ASSERT_EQ(f.tensors().size(), 4u);
    EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{ { "format", "pt" }, { "k", "v w" } }));
    const auto * a = f.find("a");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->type, ecokv::dtype::f16);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{ 2, 2 }));
    float row[2];
    a->view().row_f32(0, 0, row);
    EXPECT_EQ(row[0], 1.0f);
    EXPECT_EQ(row[1], -2.0f);
    a->view().row_f32(1, 0, row);
    EXPECT_EQ(row[0], 65504.0f);
    EXPECT_EQ(row[1], std::ldexp(1.0f, -24));
    const auto * bt = f.find("b");
    ASSERT_NE(bt, nullptr);
    EXPECT_EQ(bt->type, ecokv::dtype::f32);
    bt->view().row_f32(0, 0, row);
    EXPECT_EQ(row[0], 2.5f);
    EXPECT_EQ(row[1], -1.0f);
    const auto * s = f.find("s");
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(s->shape.empty());
    ASSERT_EQ(s->bytes.size(), 1u);
    EXPECT_EQ(std::to_integer<int>(s->bytes[0]), 42);
    EXPECT_EQ(s->view().n_elements(), 1);  // a scalar holds one element
    const auto * z = f.find("z");
    ASSERT_NE(z, nullptr);
    EXPECT_EQ(z->bytes.size(), 0u);
    EXPECT_EQ(z->view().n_elements(), 0);
}

TEST(safetensors, reads_the_golden_capture_header) {
    // tests/data/golden/tiny-f32.safetensors: 3 layers, 4 heads, 2 KV heads, head_dim 8, 56 tokens.
    const auto f = ecokv::safetensors_file::open(std::string(ECOKV_TEST_DATA) + "/golden/tiny-f32.safetensors");
    EXPECT_EQ(f.metadata().at("n_tokens"), "56");
    EXPECT_EQ(f.tensors().size(), 3u * 4 + 1);
    const auto * k = f.find("layers.2.keys");
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->shape, (std::vector<int64_t>{ 2, 56, 8 }));
    EXPECT_EQ(k->bytes.size(), 2u * 56 * 8 * 4);
}

struct corrupt_case {
    const char * name;
    std::string  bytes;
    std::vector<std::string> message;  // substrings besides the file name
};

std::string valid_data_file() {
    return safetensors_bytes(R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", std::string(16, '\0'));
}

TEST(safetensors, corrupt_files_name_the_file) {
    const std::string ok = valid_data_file();
    std::string big_len = ok;
    big_len[0]          = char(0xff);  // header length 0x...ff, far past the end
    std::string huge_len(8, char(0xff));
    huge_len += "{}";
    const std::vector<corrupt_case> cases = {
        { "empty", "", { "empty" } },
        { "short", std::string("\x08\x00\x00", 3), { "truncated" } },
        { "seven", std::string(7, '\0'), { "truncated" } },
        { "header-too-long", big_len, { "header length", "exceeds" } },
        { "header-u64-max", huge_len, { "header length" } },
        { "header-past-end", safetensors_bytes("{}", "").substr(0, 9), { "header length" } },
        { "not-json", safetensors_bytes("{\"t\": nope}", ""), { "not valid JSON" } },
        { "not-object", safetensors_bytes("[1, 2, 3]", ""), { "not a JSON object" } },
        { "bf16", safetensors_bytes(R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", std::string(4, '\0')),
          { "'w'", "BF16", "unsupported dtype" } },
        { "i64", safetensors_bytes(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
          { "'w'", "I64" } },
        { "size-mismatch",
          safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
          { "'w'", "8 bytes", "need 12" } },
        { "size-mismatch-f16",
          safetensors_bytes(R"({"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,16]}})", std::string(16, '\0')),
          { "'w'", "16 bytes", "need 8" } },
        { "offsets-beyond-data", ok.substr(0, ok.size() - 4), { "'t'", "outside", "truncated" } },
        { "offsets-reversed",
          safetensors_bytes(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", std::string(4, '\0')),
          { "'w'", "outside" } },
        { "overlap",
          safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            std::string(12, '\0')),
          { "overlap" } },
        { "metadata-number", safetensors_bytes(R"({"__metadata__":{"n_layers":3}})", ""), { "__metadata__", "n_layers" } },
        { "metadata-array", safetensors_bytes(R"({"__metadata__":["a"]})", ""), { "__metadata__" } },
        { "no-offsets", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", std::string(4, '\0')),
          { "'w'", "data_offsets" } },
        { "negative-dim",
          safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0')),
          { "'w'", "dimension" } },
        { "five-dims",
          safetensors_bytes(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1],"data_offsets":[0,1]}})", std::string(1, '\0')),
          { "'w'", "shape" } },
        // 2^40 * 2^24 elements: the element count wraps to 0 in 64 bits and would match an empty range.
        { "shape-overflow",
          safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1099511627776,16777216],"data_offsets":[0,0]}})", ""),
          { "'w'", "too large" } },
        { "shape-overflow-bytes",
          safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1099511627776,4194304],"data_offsets":[0,0]}})", ""),
          { "'w'", "too large" } },
    };
    temp_dir dir;
    for (const corrupt_case & c : cases) {
        SCOPED_TRACE(c.name);
        const std::string path = dir / (std::string(c.name) + ".safetensors");
        write_file(path, c.bytes);
        std::vector<std::string> parts = c.message;
        parts.push_back(path);
        try {
            (void) ecokv::safetensors_file::open(path);
            ADD_FAILURE() << "no error";
        } catch (const ecokv::error & e) {
            const std::string msg = e.what();
            for (const std::string & p : parts) {
                EXPECT_NE(msg.find(p), std::string::npos) << "message \"" << msg << "\" lacks \"" << p << "\"";
            }
        }
    }
}

TEST(safetensors, missing_file_and_directory) {
    temp_dir          dir;
    const std::string missing = dir / "nope.safetensors";
    expect_error([&] { (void) ecokv::safetensors_file::open(missing); }, { missing, "cannot open" });
    const std::string sub = dir / "subdir";
    fs::create_directory(sub);
    expect_error([&] { (void) ecokv::safetensors_file::open(sub); }, { sub, "not a regular file" });
}

TEST(safetensors, zero_dimension_with_large_other_dimension_is_fine) {
    // A dimension of 0 makes the tensor empty however large the others are.
    temp_dir          dir;
    const std::string path = dir / "z.safetensors";
    write_file(path, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776,0],"data_offsets":[0,0]}})", ""));
    const auto f = ecokv::safetensors_file::open(path);
    ASSERT_NE(f.find("w"), nullptr);
    EXPECT_EQ(f.find("w")->bytes.size(), 0u);
}

// ---------------------------------------------------------------------------------------------------------------
// atomic writes

TEST(write_file_atomic, missing_directory_creates_nothing) {
    temp_dir          dir;
    const std::string target = dir / "no/such/dir/out.json";
    expect_error([&] { ecokv::write_file_atomic(target, "data"); }, { target });
    EXPECT_FALSE(fs::exists(dir / "no"));
    EXPECT_TRUE(dir.list().empty());
    // The writers built on it behave the same.
    ecokv::safetensors_writer w;
    w.add("x", ecokv::dtype::u8, { 1 }, { std::byte{ 1 } });
    expect_error([&] { w.write(target); }, { target });
    EXPECT_TRUE(dir.list().empty());
}

TEST(write_file_atomic, success_leaves_only_the_target) {
    temp_dir          dir;
    const std::string target = dir / "out.bin";
    std::string       payload;
    for (int i = 0; i < 200000; ++i) {
        payload.push_back(char(i * 7));
    }
    ecokv::write_file_atomic(target, payload);
    EXPECT_EQ(read_file(target), payload);
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "out.bin" }));
    // Overwriting replaces the content entirely (shorter content: no stale tail) and leaves no temporary.
    ecokv::write_file_atomic(target, "short");
    EXPECT_EQ(read_file(target), "short");
    ecokv::write_file_atomic(target, "");
    EXPECT_EQ(read_file(target), "");
    EXPECT_TRUE(fs::exists(target));
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "out.bin" }));
    // A path relative to the current directory works too.
    const fs::path old = fs::current_path();
    fs::current_path(dir.path());
    ecokv::write_file_atomic("rel.txt", "relative");
    fs::current_path(old);
    EXPECT_EQ(read_file(dir / "rel.txt"), "relative");
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "out.bin", "rel.txt" }));
}

TEST(write_file_atomic, target_is_a_directory) {
    temp_dir          dir;
    const std::string target = dir / "taken";
    fs::create_directory(target);
    fs::path marker = fs::path(target) / "inside";
    write_file(marker.string(), "keep");
    expect_error([&] { ecokv::write_file_atomic(target, "data"); }, { target });
    EXPECT_TRUE(fs::is_directory(target));
    EXPECT_EQ(read_file(marker.string()), "keep");
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "taken" }));  // no temporary left
}

TEST(write_file_atomic, failure_keeps_the_previous_file) {
    // A failed write leaves the files already in the directory as they were.
    temp_dir          dir;
    const std::string target = dir / "out.json";
    write_file(target, "previous");
    expect_error([&] { ecokv::write_file_atomic(dir / "missing/out.json", "new"); }, { "missing/out.json" });
    EXPECT_EQ(read_file(target), "previous");
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "out.json" }));
}

}  // namespace
