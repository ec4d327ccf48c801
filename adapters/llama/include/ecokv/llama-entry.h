// ecokv-llama: a kept sequence as bytes, ecokv's own entry format (a per-head ragged cache fits no other store's):
// what a shared store holds and what Python's Sequence.save() returns. Checked whole before any byte reaches a context:
// a foreign, stale, truncated or corrupted entry is an entry_error, never a crash or a wrong cache.
//
//   "ECOKVENT" | u32 version | u64 model fingerprint | str cache shape | str compression key
//   | u8 role | u64 full-cache bytes | u64[] prompt units | snapshot (state, layout, kept cells and their modality and accumulated attention,
//   cells_seen, decoded modality, logits, own_logits, n_cells, n_past, kv_bytes_kept) | u64 XXH3-64 of all before it
//
// Integers little-endian; a str or an array is a u64 count then its elements. The fingerprint and shape name the
// model and the engine options that shape its cache (session::fingerprint(), session::cache_shape()).
#pragma once

#include "ecokv/error.h"
#include "ecokv/llama-session.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ecokv::llama {

inline constexpr uint32_t k_entry_version = 2;  // 2: the role and full-cache bytes

// What a kept sequence is to whoever keeps it: a conversation that its next turn continues, or the context before a
// question that any request about that context resumes (ecokv serve keeps both).
enum class entry_role : uint8_t { conversation = 0, context = 1 };

struct entry_header {
    uint64_t    model_fingerprint = 0;
    std::string cache_shape;      // engine options that shape the cache (types, layers, heads, head sizes)
    std::string compression_key;  // compression::key() of what made it ("full" for a full cache)
};

struct entry {
    entry_header          header;
    std::vector<uint64_t> units;  // the prompt units it holds (a server's key), or empty
    snapshot              snap;
    entry_role            role           = entry_role::conversation;
    uint64_t              kv_bytes_full  = 0;  // what its cells would take as a full cache
};

// Why an entry is refused, for counting.
enum class entry_fault { truncated, corrupted, version, foreign_model, other_shape, malformed };

struct entry_error : error {
    entry_fault fault;
    entry_error(entry_fault f, const std::string & what) : error(what), fault(f) {}
};

std::vector<uint8_t> encode_entry(const entry & e);
// The whole entry checked (length, checksum, version) then parsed with every length bounded by the bytes left;
// throws entry_error. Needs no model (the fuzz target's entry point).
entry decode_entry(std::span<const uint8_t> bytes);
// decode_entry, then the header checked against the session's: throws entry_error (foreign_model, other_shape).
entry decode_entry_for(std::span<const uint8_t> bytes, const entry_header & expected);

}  // namespace ecokv::llama
