// Prompt building: text tokens, or libmtmd chunks with each cell's modality and each image's grid, and the units
// (tokens, image content hashes) by which two prompts find the cache prefix they share. Made once, a prompt is
// prefilled, chunked or appended by sequences of its session.
#include "ecokv/error.h"
#include "session-impl.h"

#include <mtmd-helper.h>
#include <mtmd.h>
#include <openssl/evp.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace ecokv::llama {

namespace {

constexpr uint64_t k_image_unit = uint64_t(1) << 63;  // prompt::units(): an image, its content hash below

// An image's prompt unit: the first 8 bytes of the SHA-256 of its bytes, less the top bit (k_image_unit's), so that
// two requests sending the same image share cached entries and nobody can make an image that another's cache entry
// answers for (a second preimage of 63 bits of SHA-256; llama-server names images by SHA-256 for the same reason;
// FNV-1a's, used before, are easy to forge).
uint64_t image_hash(const std::vector<uint8_t> & bytes) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int  n = 0;
    if (EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr) != 1 || n < 8) {
        throw error("SHA-256 of an image failed (OpenSSL)");
    }
    uint64_t h = 0;
    for (int i = 0; i < 8; ++i) {
        h = (h << 8) | digest[i];
    }
    return h & (k_image_unit - 1);
}

// A bad image, by its index among the prompt's images.
struct image_error : error {
    size_t index;
    image_error(size_t i, const std::string & what) : error("image " + std::to_string(i + 1) + ": " + what), index(i) {}
};

// An M-RoPE image's last token sits at (row, column) = (rows - 1, columns - 1) of its grid, all at one temporal
// position; other projectors place image tokens one after the other and say nothing of a grid.
media_grid image_grid(const mtmd_image_tokens * t, int32_t first_cell) {
    const auto n = int32_t(mtmd_image_tokens_get_n_tokens(t));
    if (n == 0) {
        return { first_cell, 0, 0 };
    }
    const mtmd_decoder_pos last = mtmd_image_tokens_get_decoder_pos(t, 0, size_t(n - 1));
    if (n > 1 && last.t == 0) {
        return { first_cell, int32_t(last.y) + 1, int32_t(last.x) + 1 };
    }
    const auto side = int32_t(std::lround(std::sqrt(double(n))));
    return side * side == n ? media_grid{ first_cell, side, side } : media_grid{ first_cell, 1, n };
}

// The unit naming chunk `part` of an image: its content hash, told apart per chunk for tiled images.
uint64_t image_unit(uint64_t hash, int32_t part) {
    return k_image_unit | ((hash ^ (uint64_t(part) * 0x9e3779b97f4a7c15ull)) & (k_image_unit - 1));
}

}  // namespace

std::string media_marker() { return mtmd_default_marker(); }

std::string with_media_markers(std::string text, size_t n_images) {
    if (n_images == 0 || text.find(mtmd_default_marker()) != std::string::npos) {
        return text;
    }
    std::string markers;
    for (size_t i = 0; i < n_images; ++i) {
        markers += std::string(mtmd_default_marker()) + "\n";
    }
    return markers + text;
}

prompt::prompt(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
prompt::prompt(prompt &&) noexcept             = default;
prompt & prompt::operator=(prompt &&) noexcept = default;
prompt::~prompt()                              = default;

int32_t prompt::n_cells() const { return impl_->n_cells; }
const std::vector<uint64_t> & prompt::units() const { return impl_->units; }
int32_t prompt::cells_before(size_t unit) const { return impl_->cells.at(unit); }
int32_t prompt::n_media() const { return impl_->n_media; }
const std::vector<uint8_t> & prompt::modality() const { return impl_->modality; }
const std::vector<media_grid> & prompt::images() const { return impl_->images; }

prompt session::make_prompt(std::vector<llama_token> tokens) const {
    auto p     = std::make_unique<prompt::impl>();
    p->n_cells = int32_t(tokens.size());
    p->units.assign(tokens.begin(), tokens.end());
    for (int32_t i = 0; i <= p->n_cells; ++i) {
        p->cells.push_back(i);
    }
    p->tokens = std::move(tokens);
    return prompt(std::move(p));
}

prompt session::make_prompt(const std::string & text, const std::vector<std::string> & images) const {
    if (!images.empty() && impl_->projectors.empty()) {
        throw error("images need a projector (--mmproj)");
    }
    std::vector<std::vector<uint8_t>> bytes;
    for (const std::string & path : images) {
        std::ifstream in(path, std::ios::binary);
        if (!in || std::filesystem::is_directory(path)) {
            throw error(path + ": cannot read the image");
        }
        bytes.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    try {
        return make_prompt_from_memory(text, bytes);
    } catch (const image_error & e) {
        throw error(images[e.index] + std::string(e.what()).substr(std::string(e.what()).find(':')));
    }
}

prompt session::make_prompt_from_memory(const std::string & text, const std::vector<std::vector<uint8_t>> & images) const {
    if (images.empty()) {
        return make_prompt(tokenize(text, true));
    }
    if (impl_->projectors.empty()) {
        throw error("images need a projector (--mmproj)");
    }
    const std::string marker    = mtmd_default_marker();
    size_t            n_markers = 0;
    for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + marker.size())) {
        ++n_markers;
    }
    if (n_markers != images.size()) {  // e.g. a literal marker in a question
        throw error("the prompt holds " + std::to_string(n_markers) + " media markers (" + marker + ") for " +
                    std::to_string(images.size()) + (images.size() == 1 ? " image" : " images"));
    }
    const projector_pool::lease                               projector = impl_->projectors.take();
    std::vector<std::unique_ptr<mtmd_bitmap, mtmd_deleter>>   bitmaps;
    std::vector<const mtmd_bitmap *>                          ptrs;
    std::vector<uint64_t>                                     hashes;
    for (size_t i = 0; i < images.size(); ++i) {
        if (images[i].empty()) {
            throw image_error(i, "empty image");
        }
        bitmaps.emplace_back(mtmd_helper_bitmap_init_from_buf(projector.get(), images[i].data(),
                                                              images[i].size(), false,
                                                              mtmd_helper_init_opt_default()).bitmap);
        if (!bitmaps.back()) {
            throw image_error(i, "cannot decode the image (not a whole PNG, JPEG, BMP or GIF, or too large to decode)");
        }
        mtmd_bitmap_set_id(bitmaps.back().get(), std::to_string(i).c_str());  // every chunk of the image carries it
        ptrs.push_back(bitmaps.back().get());
        hashes.push_back(image_hash(images[i]));
    }
    auto p = std::make_unique<prompt::impl>();
    p->chunks.reset(mtmd_input_chunks_init());
    const mtmd_input_text input{ text.c_str(), text.size(), true, true };
    if (const int32_t rc = mtmd_tokenize(projector.get(), p->chunks.get(), &input, ptrs.data(), ptrs.size());
        rc != 0) {
        throw error(rc == 1 ? "the prompt's media markers do not match the number of images"
                            : impl_->opts.mmproj_path + ": an image could not be preprocessed for this projector");
    }
    std::vector<int32_t> parts(images.size(), 0);  // chunks seen per image
    for (size_t i = 0; i < mtmd_input_chunks_size(p->chunks.get()); ++i) {
        const mtmd_input_chunk * c    = mtmd_input_chunks_get(p->chunks.get(), i);
        const auto               type = mtmd_input_chunk_get_type(c);
        const uint8_t m = type == MTMD_INPUT_CHUNK_TYPE_TEXT ? 0 : type == MTMD_INPUT_CHUNK_TYPE_IMAGE ? 1 : 2;
        const size_t  n = mtmd_input_chunk_get_n_tokens(c);
        if (m == 0) {
            size_t              n_text = 0;
            const llama_token * text   = mtmd_input_chunk_get_tokens_text(c, &n_text);
            for (size_t t = 0; t < n_text; ++t) {
                p->cells.push_back(int32_t(p->modality.size() + t));
                p->units.push_back(uint64_t(text[t]));
            }
        } else {  // one unit per image chunk, named by the image's content and the chunk's place in it
            const size_t image = std::stoul(mtmd_input_chunk_get_id(c));
            const int32_t part = parts.at(image)++;
            if (m == 1) {
                media_grid g = image_grid(mtmd_input_chunk_get_tokens_image(c), int32_t(p->modality.size()));
                g.image      = int32_t(image);
                g.part       = part;
                p->images.push_back(g);
            }
            p->cells.push_back(int32_t(p->modality.size()));
            p->units.push_back(image_unit(hashes[image], part));
        }
        p->modality.insert(p->modality.end(), n, m);
        p->n_media += m != 0 ? int32_t(n) : 0;
    }
    for (media_grid & g : p->images) {
        g.n_parts = parts[size_t(g.image)];
    }
    p->cells.push_back(int32_t(p->modality.size()));
    p->n_cells = int32_t(mtmd_helper_get_n_tokens(p->chunks.get()));
    return prompt(std::move(p));
}

}  // namespace ecokv::llama
