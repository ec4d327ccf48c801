// The session API (ecokv/llama-session.h) on random-weight models built in memory, against the plain C++ reference
// forward of tiny-model.cpp: independent sequences of one session, the capture sized from the method's requirements,
// compression with a budget covering the prompt or masking evicted entries, snapshots restored in place and resumed in
// a new context, fidelity to the full cache, sequences decoding concurrently, and clear errors.
#include "ecokv/error.h"
#include "ecokv/llama-entry.h"
#include "ecokv/llama-session.h"
#include "session-test-util.h"
#include "tiny-model.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <regex>
#include <thread>

namespace {

using namespace ecokv::test;
namespace el = ecokv::llama;

el::session_options two_threads() {
    el::session_options o;
    o.n_threads = 2;
    return o;
}

ecokv::method_requirements window(int32_t n, bool full = false) {
    ecokv::method_requirements r;
    r.n_window_queries = n;
    r.full_queries     = full;
    r.values           = true;  // a device cache's values too: the tests compress with methods that read them
    return r;
}


struct fixture {
    tiny_model  m = make_tiny_model({});
    el::session s{ *m.get(), two_threads() };

    // Decodes `token` into seq (holding `prompt`, text positions) and checks the logits against the reference.
    void expect_next_matches_reference(el::sequence & seq, std::vector<int32_t> prompt, int32_t token) const {
        seq.decode({ token });
        prompt.push_back(token);
        EXPECT_LT(rel_diff(seq.logits(), reference_logits(m, prompt, text_positions(int32_t(prompt.size())))),
                  logit_rel_tolerance);
    }
};

TEST(session, independent_sequences_match_the_reference) {
    const fixture f;
    const auto    a = prompt_tokens(20, f.m.config().n_vocab, 1), b = prompt_tokens(33, f.m.config().n_vocab, 2);
    el::sequence  sa = f.s.prefill(f.s.make_prompt(a), 4, window(0));
    el::sequence  sb = f.s.prefill(f.s.make_prompt(b), 4, window(0));
    EXPECT_EQ(sa.n_past(), 20);
    EXPECT_EQ(sb.n_prompt(), 33);
    EXPECT_LT(rel_diff(sa.logits(), reference_logits(f.m, a, text_positions(20))), logit_rel_tolerance);
    EXPECT_LT(rel_diff(sb.logits(), reference_logits(f.m, b, text_positions(33))), logit_rel_tolerance);
    // Decoding into one does not touch the other.
    f.expect_next_matches_reference(sa, a, 5);
    f.expect_next_matches_reference(sb, b, 5);
}

TEST(session, the_capture_is_sized_from_the_methods_requirements) {
    const fixture f;
    const auto    tokens = prompt_tokens(48, f.m.config().n_vocab, 3);
    // A window of 40 (more than the 32 rows a capture file must hold) and a window of 4 (at least 32 are kept).
    EXPECT_EQ(f.s.prefill(f.s.make_prompt(tokens), 4, window(40)).capture().n_queries, 40);
    EXPECT_EQ(f.s.prefill(f.s.make_prompt(tokens), 4, window(4)).capture().n_queries, 32);
    const el::sequence full = f.s.prefill(f.s.make_prompt(tokens), 4, window(32, true));
    EXPECT_EQ(full.capture().layers[0].full_queries.ne[1], 48);
    // The registry decides: h2o and lookm capture every query, ecokv with --window 40 holds 40 rows.
    EXPECT_TRUE(ecokv::requirements(ecokv::parse_method("lookm"), budget(64)).full_queries);
    EXPECT_EQ(ecokv::requirements(ecokv::parse_method("ecokv"), budget(64, 40)).n_window_queries, 40);
    const ecokv::method_params w40 = budget(44, 40);
    const el::sequence         s40 =
        f.s.prefill(f.s.make_prompt(tokens), 4, ecokv::requirements(ecokv::parse_method("snapkv+ecokv"), w40));
    EXPECT_EQ(s40.compress(ecokv::parse_method("snapkv+ecokv"), w40, 4).n_cells(), 44);
}

TEST(session, compression_masks_what_was_evicted) {
    const fixture f;
    const auto    tokens = prompt_tokens(40, f.m.config().n_vocab, 11);
    el::sequence  full   = f.s.prefill(f.s.make_prompt(tokens), 8, window(32));
    el::sequence  cover  = full.compress(ecokv::parse_method("snapkv+ecokv"), budget(64), 8);
    el::sequence  small  = full.compress(ecokv::parse_method("snapkv+ecokv"), budget(12), 8);
    EXPECT_EQ(cover.n_cells(), 40);
    EXPECT_EQ(small.n_cells(), 12);
    EXPECT_EQ(small.n_past(), 40);
    // A cell: 2 layers x 2 KV heads x head_dim 16 x (K + V) x 2 bytes (F16); llama.cpp allocates 256 cells at least
    // to a full cache. The compressed one holds, per layer and KV head, the 12 kept entries, the label cell and room
    // for 8 tokens: 21 entries of 64 bytes.
    EXPECT_EQ(small.kv_bytes_per_cell(), 256u);
    EXPECT_EQ(full.kv_bytes_allocated(), 256u * 256u);
    EXPECT_EQ(small.kv_bytes_allocated(), 2u * 2 * 21 * 64);
    EXPECT_EQ(full.kv_bytes_kept(), 40u * 256u);
    EXPECT_EQ(small.kv_bytes_kept(), 12u * 256u);
    const keep_fn keep = kept_mask(small.kept_cells(), 2, 40);
    auto next = tokens;
    next.push_back(9);
    cover.decode({ 9 });
    small.decode({ 9 });
    EXPECT_LT(rel_diff(cover.logits(), reference_logits(f.m, next, text_positions(41))), logit_rel_tolerance);
    EXPECT_LT(rel_diff(small.logits(), reference_logits(f.m, next, text_positions(41), keep)), logit_rel_tolerance);
    EXPECT_GT(rel_diff(small.logits(), reference_logits(f.m, next, text_positions(41))), 3 * logit_rel_tolerance);
}

// A compression copies to the host only what the method reads: every offloaded layer's keys of the prompt and the
// capture's window rows of queries, and its values only for a method that reads them (ECOKV's value norms); the kept
// rows are gathered on the device. Counted by hand for the fixture's model (2 layers, 4 query heads and 2 KV heads of
// 16 elements, F16 cache, F32 queries, 48 prompt cells, 32 window rows); the offloaded layers are those llama.cpp puts
// on the GPU for -ngl n (the last n - 1, the output layer counting as one), none without a GPU device. The kept
// entries give the logits of the reference with the evicted ones masked.
TEST(session, compression_copies_to_the_host_only_what_the_method_reads) {
    const fixture f;
    const auto    tokens  = prompt_tokens(48, f.m.config().n_vocab, 21);
    const int32_t n_layer = f.m.config().n_layer, ngl = f.m.config().n_gpu_layers;
    const int32_t on_gpu  = !el::gpu_offload_supported() ? 0
                            : ngl < 0                   ? n_layer
                                                        : n_layer - std::clamp(n_layer + 1 - ngl, 0, n_layer);
    const uint64_t keys = 48u * 2 * 16 * 2, queries = 32u * 4 * 16 * 4, values = keys;
    for (const char * method : { "snapkv", "snapkv+ecokv" }) {
        SCOPED_TRACE(method);
        const ecokv::method_spec spec = ecokv::parse_method(method);
        const auto               needs = ecokv::requirements(spec, budget(16, 4));
        EXPECT_EQ(needs.values, spec.scorer == "ecokv");  // the registry says who reads values
        el::sequence full = f.s.prefill(f.s.make_prompt(tokens), 4, needs);
        full.compress_in_place(spec, budget(16, 4));
        // Queries come from wherever the scheduler computed them: an offloaded layer's on the device, and, since
        // llama.cpp moves the batch's ops to the GPU (op_offload), possibly a CPU layer's too.
        const uint64_t cache = uint64_t(on_gpu) * (keys + (needs.values ? values : 0));
        const uint64_t moved = full.compression().bytes_to_host;
        ASSERT_GE(moved, cache + on_gpu * queries);
        EXPECT_EQ((moved - cache) % queries, 0u);
        EXPECT_LE(moved - cache, uint64_t(el::gpu_offload_supported() ? n_layer : 0) * queries);
        auto next = tokens;
        next.push_back(9);
        full.decode({ 9 });
        EXPECT_LT(rel_diff(full.logits(), reference_logits(f.m, next, text_positions(49),
                                                           kept_mask(full.kept_cells(), 2, 48))),
                  logit_rel_tolerance);
    }
}

// What a query sees in a chunked prefill whose chunks end at `ends`, kept[k] being each (layer, KV head)'s kept cells
// after chunk k: its own chunk (causally) and what its head kept after the chunk before; a token after the last chunk
// sees what the last compression kept.
keep_fn chunked_visibility(const std::vector<int32_t> & ends, const std::vector<std::vector<std::vector<int32_t>>> & kept,
                           int32_t n_kv) {
    return [&ends, &kept, n_kv](int32_t il, int32_t g, int32_t qi, int32_t kj) {
        size_t c = 0;  // the chunk of query qi (ends.size(): after the last)
        while (c < ends.size() && qi >= ends[c]) {
            ++c;
        }
        if (c == 0 || kj >= ends[c - 1]) {
            return true;
        }
        const auto & h = kept[c - 1][size_t(il) * n_kv + g];
        return std::binary_search(h.begin(), h.end(), kj);
    };
}

// Chunked prefill, one chunk at a time: after each chunk, the logits are the reference's where every query of the
// chunk sees, per (layer, KV head), what that head kept after the chunk before plus the chunk itself; decoding after
// the last chunk sees what the last compression kept. For a uniform and two ragged allocators.
TEST(session, chunked_prefill_attends_to_what_each_chunk_kept) {
    const fixture f;
    const auto    tokens = prompt_tokens(100, f.m.config().n_vocab, 21);
    const auto    p      = f.s.make_prompt(tokens);
    for (const char * name : { "snapkv+ecokv", "adakv+ecokv", "pyramidkv+knorm", "h2o" }) {
        const ecokv::method_spec   spec = ecokv::parse_method(name);
        const ecokv::method_params par  = budget(20, 4);
        // chunks [0, 30) [30, 60) [60, 100): 40 cells of room
        el::sequence seq = f.s.prefill(p, 40, ecokv::requirements(spec, par), 30);
        seq.compress_in_place(spec, par);
        std::vector<std::vector<std::vector<int32_t>>> kept = { seq.kept_cells() };  // after each chunk
        const std::vector<int32_t>                     ends = { 30, 60, 100 };
        const keep_fn                                  see  = chunked_visibility(ends, kept, 2);
        for (size_t k = 1; k < ends.size(); ++k) {
            seq.extend(p, size_t(ends[k - 1]), size_t(ends[k]), spec, par, k + 1 < ends.size() ? 40 : 8);
            const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + ends[k]);
            EXPECT_LT(rel_diff(seq.logits(), reference_logits(f.m, prefix, text_positions(ends[k]), see)),
                      logit_rel_tolerance)
                << name << " chunk " << k;
            EXPECT_GT(rel_diff(seq.logits(), reference_logits(f.m, prefix, text_positions(ends[k]))),
                      3 * logit_rel_tolerance)
                << name << " chunk " << k << ": the evictions should show";
            kept.push_back(seq.kept_cells());
        }
        for (const auto & h : kept.back()) {
            EXPECT_TRUE(std::is_sorted(h.begin(), h.end()));
            EXPECT_LE(h.size(), 20u + 16);  // the allocators move budget between heads
            EXPECT_EQ(h.back(), 99);        // the window: the last chunk's last 4 cells
        }
        // Decoding after the last chunk sees its kept cells.
        auto next = tokens;
        next.push_back(9);
        seq.decode({ 9 });
        EXPECT_LT(rel_diff(seq.logits(), reference_logits(f.m, next, text_positions(101), see)), logit_rel_tolerance)
            << name;
    }
}

// Gemma 3's interleaved sliding-window attention: the global layers are compressed, the sliding-window ones keep
// llama.cpp's cache of their window (256 cells: a window of 8 and a ubatch, padded). Chunk by chunk, the logits are the
// reference's where the global layers' queries see what their heads kept and the others see their window; a long
// answer wraps around the window's cache, and rewind() still comes back to the compression (its window put back);
// a snapshot resumes elsewhere with its window.
TEST(session, an_iswa_model_keeps_its_window_through_chunks_rewind_and_snapshots) {
    tiny_config c;
    c.arch    = "gemma3";
    c.n_layer = 4;  // layers 1 and 3 global, 0 and 2 sliding (window 8)
    const tiny_model  m = make_tiny_model(c);
    el::session_options o = two_threads();
    o.n_ctx               = 512;
    o.n_ubatch            = 16;  // the window's cache: 8 + 16 cells, padded to 256
    const el::session s{ *m.get(), o };
    const auto        tokens = prompt_tokens(60, c.n_vocab, 31);
    const auto        p      = s.make_prompt(tokens);
    const auto        spec   = ecokv::parse_method("adakv+ecokv");
    const auto        par    = budget(12, 4);
    el::sequence      seq    = s.prefill(p, 300, ecokv::requirements(spec, par), 30);
    seq.compress_in_place(spec, par);
    std::vector<std::vector<std::vector<int32_t>>> kept = { seq.kept_cells() };
    ASSERT_EQ(kept[0].size(), 2u * 2);  // 2 global layers x 2 KV heads
    const std::vector<int32_t> ends = { 30, 60 };
    const keep_fn              global_see = chunked_visibility(ends, kept, 2);
    const keep_fn              see = [&](int32_t il, int32_t g, int32_t qi, int32_t kj) {
        return m.is_swa(il) || global_see(il / 2, g, qi, kj);  // model layers 1, 3 are selection layers 0, 1
    };
    seq.extend(p, 30, 60, spec, par, 300);
    kept.push_back(seq.kept_cells());
    EXPECT_LT(rel_diff(seq.logits(), reference_logits(m, tokens, text_positions(60), see)), logit_rel_tolerance);
    EXPECT_GT(rel_diff(seq.logits(), reference_logits(m, tokens, text_positions(60))), 3 * logit_rel_tolerance);

    const el::snapshot origin = seq.save();
    const auto         first  = seq.answer({ 3, 4 }, 280, true);  // past the 256 cells of the window's cache
    ASSERT_GT(first.tokens.size(), 250u) << "the answer stopped early: it should wrap the window's cache";
    auto next = tokens;
    next.insert(next.end(), { 3, 4 });
    next.insert(next.end(), first.tokens.begin(), first.tokens.end() - 1);
    EXPECT_LT(rel_diff(first.logits.back(), reference_logits(m, next, text_positions(int32_t(next.size())), see)),
              logit_rel_tolerance);
    // The window put back holds its cells in other slots of its cache than the prefill left them in: the same sums, in
    // another order on a device (6e-6 of the logits on lavapipe; a wrong window moves them by 1e-2).
    const bool   device = el::gpu_offload_supported();
    seq.rewind();
    const auto again = seq.answer({ 3, 4 }, 6, true);
    for (size_t i = 0; i < again.logits.size(); ++i) {
        if (device) {
            EXPECT_LT(rel_diff(again.logits[i], first.logits[i]), 2e-5) << "step " << i;
        } else {
            EXPECT_EQ(again.logits[i], first.logits[i]) << "step " << i;
        }
    }
    el::sequence moved = s.resume(origin, ecokv::compression::none(), 16);
    const auto   there = moved.answer({ 3, 4 }, 6, true);
    for (size_t i = 0; i < there.logits.size(); ++i) {
        EXPECT_LT(rel_diff(there.logits[i], first.logits[i]), device ? 2e-5 : 1e-6) << "step " << i;
    }
}

// An answer that re-compresses every 12 decoded cells (decode_compress) is a chunked prefill of what it decodes:
// after 20 greedy tokens (19 decoded: cells 40..58) the cache was compressed after the prompt and once more after
// cells 40..51, and the last logits are the reference's where the cells 52..58 see what that compression kept plus
// themselves. The kept cells number the decoded ones on from the prompt's; the room never grows.
TEST(session, a_re_compressing_answer_attends_to_what_each_step_kept) {
    const fixture f;
    const auto    tokens = prompt_tokens(40, f.m.config().n_vocab, 23);
    const auto    p      = f.s.make_prompt(tokens);
    for (const char * name : { "snapkv+ecokv", "adakv+ecokv", "h2o" }) {
        const ecokv::method_spec   spec = ecokv::parse_method(name);
        const ecokv::method_params par  = budget(16, 4);
        ecokv::compression         c    = { true, spec, par };
        c.decode_compress                                   = 12;
        el::sequence                                   seq  = f.s.prefill(p, c, 24);
        std::vector<std::vector<std::vector<int32_t>>> kept = { seq.kept_cells() };
        const el::generation                           gen  = seq.answer({}, 20);
        ASSERT_EQ(gen.tokens.size(), 20u) << name << ": no end-of-generation token on this seed";
        kept.push_back(seq.kept_cells());
        std::vector<int32_t> all = tokens;
        all.insert(all.end(), gen.tokens.begin(), gen.tokens.end() - 1);  // the last token picked is not decoded
        const std::vector<int32_t> ends = { 40, 52, 59 };
        EXPECT_EQ(seq.n_past(), 59);
        EXPECT_LT(rel_diff(seq.logits(), reference_logits(f.m, all, text_positions(59), chunked_visibility(ends, kept, 2))),
                  logit_rel_tolerance)
            << name;
        EXPECT_GT(rel_diff(seq.logits(), reference_logits(f.m, all, text_positions(59))), 3 * logit_rel_tolerance)
            << name << ": the evictions should show";
        size_t total = 0;
        for (const auto & h : kept.back()) {
            EXPECT_TRUE(std::is_sorted(h.begin(), h.end()));
            EXPECT_EQ(h.back(), 51) << "the window: the last 4 cells before the re-compression";
            total += h.size();
        }
        if (std::string(name) != "adakv+ecokv") {
            EXPECT_EQ(total, kept.back().size() * 16) << "16 entries in every head";
        } else {
            EXPECT_LE(total, kept.back().size() * 16) << "the budget, moved between heads by AdaKV";
        }
        EXPECT_EQ(seq.n_held(), seq.n_cells() + 7) << "kept entries and the 7 cells decoded since";
        EXPECT_LE(seq.peak_kv_cells(), 256) << "no head ever past llama.cpp's smallest cache";
    }
}

// A re-compressing answer needs a period larger than the window.
TEST(session, a_re_compressing_answer_refuses_what_it_cannot_do) {
    const fixture      f;
    const auto         p = f.s.make_prompt(prompt_tokens(40, f.m.config().n_vocab, 24));
    ecokv::compression c = { true, ecokv::parse_method("snapkv"), budget(16, 4) };
    c.decode_compress    = 4;
    try {
        f.s.prefill(p, c, 24);
        ADD_FAILURE() << "no error";
    } catch (const ecokv::error & e) {
        EXPECT_EQ(std::string(e.what()), "--decode-compress 4 must be larger than the window of 4");
    }
}

// Streaming H2O through the engine: a chunked prefill whose first chunk (60 cells) is kept whole by a budget of 64,
// then compressed after the second (40), keeps in every head exactly the cells one compression of the whole prefill
// keeps (every query then saw the same keys: the accumulated attention carried from the first chunk is the one-shot
// sum's part); and the re-compression of an answer accepts H2O.
TEST(session, h2o_streams_its_accumulated_attention_across_chunks) {
    const fixture              f;
    const auto                 p    = f.s.make_prompt(prompt_tokens(100, f.m.config().n_vocab, 28));
    const ecokv::method_spec   spec = ecokv::parse_method("h2o");
    const ecokv::method_params par  = budget(64, 4);
    el::sequence               one  = f.s.prefill(p, 8, ecokv::requirements(spec, par));
    one.compress_in_place(spec, par);
    ecokv::compression c = { true, spec, par };
    c.chunk              = 60;
    el::sequence chunked = f.s.prefill(p, c, 8);
    EXPECT_EQ(chunked.kept_cells(), one.kept_cells());
    for (const auto & h : one.kept_cells()) {
        EXPECT_EQ(h.size(), 64u);
    }
}

// A conversation compressed again after its second turn (recompress), across a snapshot as the server keeps it: the
// prompt (40 cells) compressed to 16 per head; turn 1 (a 6-token message, 7 answer tokens decoded) and turn 2 (10 and
// 7) appended, the second after save() and resume(); then 16 + 13 entries besides the last turn's 17 (more where
// AdaKV gave a head more) exceed budget + slack, so every head keeps the best 12 of what it held before cell 53
// (budget 16 less the window of 4, which lies inside the turn), then all of cells 53..69. The next token's logits are the reference's where cells
// 40..69 saw what the prompt's compression kept plus themselves and cell 70 sees what the re-compression kept.
TEST(session, a_conversation_compresses_again_with_its_last_turn_whole) {
    const fixture f;
    const auto    tokens = prompt_tokens(40, f.m.config().n_vocab, 25);
    const auto    p      = f.s.make_prompt(tokens);
    for (const char * name : { "snapkv+ecokv", "adakv+ecokv", "h2o" }) {
        const ecokv::method_spec   spec = ecokv::parse_method(name);
        const ecokv::method_params par  = budget(16, 4);
        ecokv::compression         c     = { true, spec, par };
        c.recompress_slack                 = 4;  // compressed again between turns: the window's queries recorded
        el::sequence               first = f.s.prefill(p, c, 24);
        std::vector<std::vector<std::vector<int32_t>>> kept = { first.kept_cells() };
        std::vector<int32_t>                           all  = tokens;
        const auto turn = [&](el::sequence & s, const std::vector<int32_t> & message) {
            const el::generation g = s.answer(message, 8);
            EXPECT_EQ(g.tokens.size(), 8u) << name << ": no end-of-generation token on this seed";
            all.insert(all.end(), message.begin(), message.end());
            all.insert(all.end(), g.tokens.begin(), g.tokens.end() - 1);  // the last token picked is not decoded
        };
        turn(first, prompt_tokens(6, f.m.config().n_vocab, 26));
        EXPECT_FALSE(first.end_turn()) << "16 entries besides the turn's 13 cells: within the slack";
        {  // with no slack, the end of the turn compresses again, the turn's 6 + 7 cells whole in every head
            ecokv::compression tight = c;
            tight.recompress_slack   = 0;
            el::sequence other       = f.s.resume(first.save(), tight, 18);
            other.answer(prompt_tokens(6, f.m.config().n_vocab, 29), 8);
            EXPECT_TRUE(other.end_turn()) << name;
            EXPECT_EQ(other.n_recompressions(), 1) << name;
            for (const auto & h : other.kept_cells()) {
                ASSERT_GE(h.size(), 13u) << name;
                EXPECT_EQ(h[h.size() - 13], h.back() - 12) << name << ": the last 13 cells kept whole";
            }
        }
        el::sequence seq = f.s.resume(first.save(), c, 18);
        turn(seq, prompt_tokens(10, f.m.config().n_vocab, 27));
        ASSERT_EQ(all.size(), 70u);
        EXPECT_EQ(seq.n_held(), seq.n_cells() + 30);
        // The longest head holds n_cells() + 13 entries besides the turn: compressed again above budget + slack only.
        const int32_t slack = seq.n_cells() + 13 - par.budget;
        EXPECT_FALSE(seq.recompress(spec, par, 17, slack, 8)) << name;
        ASSERT_TRUE(seq.recompress(spec, par, 17, slack - 1, 8)) << name;
        kept.push_back(seq.kept_cells());
        size_t total = 0;
        for (const auto & h : kept.back()) {
            ASSERT_GE(h.size(), 17u);
            EXPECT_EQ(std::vector<int32_t>(h.end() - 17, h.end()), [] {
                std::vector<int32_t> turn2(17);
                std::iota(turn2.begin(), turn2.end(), 53);
                return turn2;
            }()) << name << ": the last turn is kept whole";
            EXPECT_LT(h[h.size() - 18], 53);
            total += h.size() - 17;
        }
        if (std::string(name) != "adakv+ecokv") {
            EXPECT_EQ(total, kept.back().size() * 12) << "the best 12 before the turn, in every head";
        } else {
            EXPECT_LE(total, kept.back().size() * 12) << "12 a head on average, moved between heads by AdaKV";
        }
        seq.decode({ 9 });
        all.push_back(9);
        EXPECT_LT(rel_diff(seq.logits(), reference_logits(f.m, all, text_positions(71),
                                                          chunked_visibility({ 40, 70 }, kept, 2))),
                  logit_rel_tolerance)
            << name;
        EXPECT_GT(rel_diff(seq.logits(), reference_logits(f.m, all, text_positions(71))), 3 * logit_rel_tolerance)
            << name << ": the evictions should show";
    }
}

// A chunked prefill (compression.chunk) is those steps; its KV cache peaks at llama.cpp's smallest (256 cells) where one shot allocates
// the whole prompt's (1000 tokens and 4 new ones, in cells padded to 256: 1024).
TEST(session, chunked_prefill_bounds_the_peak) {
    const fixture              f;
    const auto                 tokens = prompt_tokens(1000, f.m.config().n_vocab, 22);
    const auto                 p      = f.s.make_prompt(tokens);
    const ecokv::method_spec   spec   = ecokv::parse_method("snapkv");
    const ecokv::method_params par    = budget(32, 8);
    ecokv::compression         c       = { true, spec, par };
    c.chunk                            = 64;
    el::sequence               chunked = f.s.prefill(p, c, 4);
    el::sequence               one     = f.s.prefill(p, 4, ecokv::requirements(spec, par));
    one.compress_in_place(spec, par);
    EXPECT_EQ(one.peak_kv_cells(), 1024);
    EXPECT_EQ(chunked.peak_kv_cells(), 256);
    // A cell of every head is 256 bytes (see above): one shot holds the full cache and the kept entries (32 + 1 + 4
    // rows of 64 bytes per head, 4 heads) together for a moment; chunked, the first chunk's context and the
    // first ragged cache (32 + 1 + 64 rows).
    EXPECT_EQ(one.peak_kv_bytes(), 1024u * 256 + 4u * 37 * 64);
    EXPECT_EQ(chunked.peak_kv_bytes(), 256u * 256 + 4u * 97 * 64);
    EXPECT_EQ(chunked.n_past(), 1000);
    for (const auto & h : chunked.kept_cells()) {
        EXPECT_EQ(h.size(), 32u);
        EXPECT_EQ(h.back(), 999);
    }
}

TEST(session, snapshots_restore_in_place_and_resume_elsewhere) {
    const fixture      f;
    const auto         tokens = prompt_tokens(30, f.m.config().n_vocab, 5);
    const el::sequence full   = f.s.prefill(f.s.make_prompt(tokens), 16, window(32));
    el::sequence       comp   = full.compress(ecokv::parse_method("pyramidkv+ecokv"), budget(14, 4), 16);
    const el::snapshot origin = comp.save();
    const auto         first  = comp.answer({ 3, 4 }, 6, true);
    comp.restore(origin);
    EXPECT_EQ(comp.n_past(), 30);
    EXPECT_EQ(comp.answer({ 3, 4 }, 6, true).tokens, first.tokens);
    comp.rewind();  // removes what was decoded since the compression, without a copy
    EXPECT_EQ(comp.n_past(), 30);
    const auto rewound = comp.answer({ 3, 4 }, 6, true);
    ASSERT_EQ(rewound.logits.size(), first.logits.size());
    for (size_t i = 0; i < first.logits.size(); ++i) {
        EXPECT_EQ(rewound.logits[i], first.logits[i]) << "step " << i;
    }
    el::sequence moved = f.s.resume(origin, ecokv::compression::none(), 16);
    EXPECT_EQ(moved.n_cells(), comp.n_cells());
    const auto again = moved.answer({ 3, 4 }, 6, true);
    ASSERT_EQ(again.logits.size(), first.logits.size());
    for (size_t i = 0; i < first.logits.size(); ++i) {
        EXPECT_LT(rel_diff(again.logits[i], first.logits[i]), 1e-6) << "step " << i;
    }
}

// A kept sequence as an entry (ecokv/llama-entry.h): encoded and decoded to the same snapshot, which resumes to the
// same logits; every fault refused as an entry_error before anything reaches a context: a flipped byte or a
// truncation anywhere (the checksum), another version, another model, another cache shape, and lengths that
// overrun the entry behind a valid checksum.
TEST(session, an_entry_round_trips_and_refuses_every_fault) {
    const fixture      f;
    const auto         tokens = prompt_tokens(40, f.m.config().n_vocab, 5);
    const el::sequence full   = f.s.prefill(f.s.make_prompt(tokens), 16, window(32));
    el::sequence       comp   = full.compress(ecokv::parse_method("adakv+ecokv"), budget(14, 4), 16);
    comp.decode({ 3, 4 });
    const el::entry_header header{ f.s.fingerprint(), f.s.cache_shape(), "adakv+ecokv budget=14" };
    const el::entry        made{ header, { 7, 8, 9 }, comp.save(), el::entry_role::context, 123456 };
    const std::vector<uint8_t> bytes = el::encode_entry(made);
    const el::entry            back  = el::decode_entry_for(bytes, header);
    EXPECT_EQ(back.units, made.units);
    EXPECT_EQ(back.role, el::entry_role::context);
    EXPECT_EQ(back.kv_bytes_full, 123456u);
    EXPECT_EQ(back.header.compression_key, header.compression_key);
    EXPECT_EQ(back.snap.state, made.snap.state);
    EXPECT_EQ(back.snap.layout, made.snap.layout);
    EXPECT_EQ(back.snap.kept_cells, made.snap.kept_cells);
    EXPECT_EQ(back.snap.logits, made.snap.logits);
    EXPECT_EQ(back.snap.n_past, made.snap.n_past);
    EXPECT_EQ(back.snap.n_cells, made.snap.n_cells);
    EXPECT_EQ(back.snap.kv_bytes_kept, made.snap.kv_bytes_kept);
    EXPECT_EQ(el::encode_entry(back), bytes);  // nothing lost either way
    el::sequence a = f.s.resume(made.snap, ecokv::compression::none(), 8), b = f.s.resume(back.snap, ecokv::compression::none(), 8);
    EXPECT_EQ(a.answer({ 5 }, 4, true).logits, b.answer({ 5 }, 4, true).logits);

    const auto fault_of = [&](const std::vector<uint8_t> & x, const el::entry_header & h) {
        try {
            el::decode_entry_for(x, h);
        } catch (const el::entry_error & e) {
            return int(e.fault);
        }
        return -1;
    };
    for (size_t at = 0; at < bytes.size(); at += std::max<size_t>(1, bytes.size() / 997)) {
        std::vector<uint8_t> flipped = bytes;
        flipped[at] ^= 0x10;
        EXPECT_NE(fault_of(flipped, header), -1) << "a flipped byte at " << at;
        EXPECT_NE(fault_of({ bytes.begin(), bytes.begin() + std::ptrdiff_t(at) }, header), -1) << "cut at " << at;
    }
    EXPECT_EQ(fault_of(bytes, { header.model_fingerprint + 1, header.cache_shape, "" }), int(el::entry_fault::foreign_model));
    EXPECT_EQ(fault_of(bytes, { header.model_fingerprint, "k=q8_0", "" }), int(el::entry_fault::other_shape));
    // A field rewritten with the checksum made again: only the parser's own checks stand.
    const auto resealed = [&](std::vector<uint8_t> x, size_t at, uint64_t value, size_t width) {
        std::memcpy(x.data() + at, &value, width);
        x.resize(x.size() - 8);
        const uint64_t sum = XXH3_64bits(x.data(), x.size());
        x.insert(x.end(), reinterpret_cast<const uint8_t *>(&sum), reinterpret_cast<const uint8_t *>(&sum) + 8);
        return x;
    };
    EXPECT_EQ(fault_of(resealed(bytes, 8, 1, 4), header), int(el::entry_fault::version));  // version 1: no role
    const size_t role_at  = 8 + 4 + 8 + 8 + header.cache_shape.size() + 8 + header.compression_key.size();
    EXPECT_EQ(fault_of(resealed(bytes, role_at, 2, 1), header), int(el::entry_fault::malformed));  // no such role
    const size_t units_at = role_at + 1 + 8;
    EXPECT_EQ(fault_of(resealed(bytes, units_at, uint64_t(1) << 60, 8), header), int(el::entry_fault::malformed));
    EXPECT_EQ(fault_of(resealed(bytes, units_at, 4, 8), header), int(el::entry_fault::malformed));  // shifted fields
}

// A snapshot holds what was decoded since too; restoring one replaces the layout of the cache by its own.
TEST(session, snapshots_carry_decoded_tokens_and_their_own_layout) {
    const fixture      f;
    const auto         tokens  = prompt_tokens(30, f.m.config().n_vocab, 8);
    const el::sequence full    = f.s.prefill(f.s.make_prompt(tokens), 16, window(32));
    el::sequence       uniform = full.compress(ecokv::parse_method("snapkv+ecokv"), budget(14, 4), 16);
    el::sequence       padded  = full.compress(ecokv::parse_method("pyramidkv+ecokv"), budget(14, 4), 16);
    const el::snapshot u       = uniform.save();
    EXPECT_EQ(u.layout, std::vector<uint32_t>(2 * 2, 14));
    EXPECT_NE(padded.save().layout, u.layout);
    const auto want = uniform.answer({ 5 }, 4, true);
    padded.restore(u);
    const auto got = padded.answer({ 5 }, 4, true);
    EXPECT_EQ(got.tokens, want.tokens);
    for (size_t i = 0; i < want.logits.size(); ++i) {
        EXPECT_EQ(got.logits[i], want.logits[i]) << "step " << i;
    }
    EXPECT_THROW(padded.compress(ecokv::parse_method("snapkv"), budget(12, 4), 4), ecokv::error);  // no capture now

    const el::snapshot later = padded.save();  // the label cell + the question + the decoded answer tokens
    EXPECT_EQ(later.n_cells, 1 + 1 + int32_t(got.tokens.size()) - 1);
    EXPECT_EQ(padded.kv_bytes_allocated(), uint64_t(2 * 2 * (14 + 1 + 16)) * 64);
    el::sequence moved = f.s.resume(later, ecokv::compression::none(), 4);
    EXPECT_EQ(moved.n_past(), padded.n_past());
    moved.decode({ 9 });
    padded.decode({ 9 });
    EXPECT_EQ(moved.logits(), padded.logits());
}

// A decode that fails (here: more tokens than the context holds) leaves the sequence as it was.
TEST(session, a_failed_decode_changes_nothing) {
    const fixture f;
    const auto    tokens = prompt_tokens(30, f.m.config().n_vocab, 12);
    el::sequence  seq    = f.s.prefill(f.s.make_prompt(tokens), 4, window(0));
    const auto    before = seq.logits();
    EXPECT_THROW(seq.decode(prompt_tokens(300, f.m.config().n_vocab, 13)), ecokv::error);
    EXPECT_EQ(seq.n_past(), 30);
    EXPECT_EQ(seq.logits(), before);
    f.expect_next_matches_reference(seq, tokens, 9);
}

TEST(session, fidelity_of_a_covering_budget_is_exact) {
    const fixture f;
    const auto    tokens = prompt_tokens(36, f.m.config().n_vocab, 9);
    el::sequence  full   = f.s.prefill(f.s.make_prompt(tokens), 12, window(32));
    el::sequence  cover  = full.compress(ecokv::parse_method("snapkv+ecokv"), budget(64), 12, true);
    el::sequence  small  = full.compress(ecokv::parse_method("snapkv+ecokv"), budget(10, 4), 12, true);
    const std::vector<llama_token> question = { 7, 8, 9 };
    const el::reference            ref      = full.answer_reference(question, 6);
    ASSERT_EQ(ref.attention.size(), ref.answer.tokens.size() - 1);
    const el::fidelity_report same = cover.fidelity(question, ref);
    EXPECT_EQ(same.n, int32_t(ref.answer.tokens.size()));  // the question was decoded here: every token counts
    EXPECT_EQ(same.agreement, 1.0);
    EXPECT_LT(same.mean_kl, 1e-6);
    ASSERT_EQ(same.attn_rel_error.size(), 2u);
    for (double e : same.attn_rel_error) {
        EXPECT_LT(e, 1e-5);
    }
    const el::fidelity_report diff = small.fidelity(question, ref);
    EXPECT_GT(*std::max_element(diff.attn_rel_error.begin(), diff.attn_rel_error.end()), 1e-3);
}

// A prefilled sequence that has answered since still compresses its prompt: the compressed sequence starts at the
// prompt's position with the prompt's logits.
TEST(session, compressing_after_decoding_starts_from_the_prompt) {
    const fixture f;
    const auto    tokens = prompt_tokens(30, f.m.config().n_vocab, 4);
    el::sequence  full   = f.s.prefill(f.s.make_prompt(tokens), 12, window(32));
    const std::vector<float> prompt_logits = full.logits();
    const el::reference      ref           = full.answer_reference({ 6, 7 }, 5);
    EXPECT_EQ(full.n_past(), 30 + 2 + int32_t(ref.answer.tokens.size()) - 1);
    el::sequence cover = full.compress(ecokv::parse_method("snapkv+ecokv"), budget(64), 12);
    EXPECT_EQ(cover.n_past(), 30);
    EXPECT_EQ(cover.logits(), prompt_logits);
    const el::fidelity_report same = cover.fidelity({ 6, 7 }, ref);
    EXPECT_EQ(same.agreement, 1.0);
    EXPECT_LT(same.mean_kl, 1e-6);
}

TEST(session, sequences_decode_concurrently) {
    const fixture                         f;
    std::vector<std::vector<int32_t>>     prompts;
    std::vector<el::sequence>             seqs;
    for (uint32_t i = 0; i < 3; ++i) {
        prompts.push_back(prompt_tokens(24 + 4 * int32_t(i), f.m.config().n_vocab, 20 + i));
        seqs.push_back(f.s.prefill(f.s.make_prompt(prompts.back()), 8, window(0)));
    }
    std::vector<el::generation> got(3);
    std::vector<std::thread>    threads;
    for (size_t i = 0; i < 3; ++i) {
        threads.emplace_back([&, i] { got[i] = seqs[i].greedy(6, true); });
    }
    for (auto & t : threads) {
        t.join();
    }
    for (size_t i = 0; i < 3; ++i) {  // each equals its sequential run
        const el::generation want = f.s.prefill(f.s.make_prompt(prompts[i]), 8, window(0)).greedy(6, true);
        EXPECT_EQ(got[i].tokens, want.tokens) << "sequence " << i;
    }
}

// ggml's scheduler prints each graph's splits (backend, inputs copied into it) when GGML_SCHED_DEBUG is set as a
// context is made; what the log says while `on`.
struct split_log {
    std::string text;
    bool        on = false;
};
split_log g_splits;

// Decoding on the device moves nothing to the host but the logits, whatever the cache's layout: every split the
// scheduler runs on the CPU (the token embedding lookup, weights in host memory) takes no input, i.e. nothing computed
// on the device is copied back, so that a token moves its logits (n_vocab floats) and nothing else. The full cache,
// uniform and per-head (AdaKV) budgets, and a chunked prefill's cache; three tokens each, after one. With no layer offloaded
// nothing can move: skipped then.
TEST(session, decoding_on_the_device_moves_only_the_logits_to_the_host) {
    if (tiny_config::test_gpu_layers() == 0 || !el::gpu_offload_supported()) {
        GTEST_SKIP() << "no layer offloaded (ECOKV_TEST_NGL): nothing can move";
    }
    setenv("GGML_SCHED_DEBUG", "1", 1);
    setenv("LLAMA_GRAPH_REUSE_DISABLE", "1", 1);  // every graph split anew, so every token's splits are printed
    const fixture f;
    llama_log_set(
        [](ggml_log_level, const char * text, void *) {
            if (g_splits.on) {
                g_splits.text += text;
            }
        },
        nullptr);
    const auto    tokens = prompt_tokens(60, f.m.config().n_vocab, 21);
    const auto    p      = f.s.make_prompt(tokens);
    const ecokv::method_params par = budget(16, 4);
    struct layout {
        const char * name;
        const char * method;  // null: the full cache
        int32_t      chunk;   // 0: one shot
    };
    for (const layout & l : { layout{ "full", nullptr, 0 }, layout{ "uniform", "snapkv+ecokv", 0 },
                              layout{ "adakv", "adakv+ecokv", 0 }, layout{ "chunked", "snapkv+ecokv", 30 } }) {
        SCOPED_TRACE(l.name);
        std::optional<el::sequence> seq;
        if (!l.method) {
            seq.emplace(f.s.prefill(p, 8, window(0)));
        } else {
            const ecokv::method_spec spec = ecokv::parse_method(l.method);
            seq.emplace(f.s.prefill(p, l.chunk ? 38 : 8, ecokv::requirements(spec, par), l.chunk ? 30 : size_t(-1)));
            seq->compress_in_place(spec, par);
            if (l.chunk) {
                seq->extend(p, 30, 60, spec, par, 8);
            }
        }
        seq->decode({ 8 });  // llama.cpp reserves the new layout's worst-case graph here: that graph is not run
        g_splits = { "", true };
        for (int32_t i = 0; i < 3; ++i) {
            seq->decode({ 9 + i });
        }
        g_splits.on = false;
        const std::regex split(R"(## SPLIT #\d+: (\S+) # (\d+) inputs)");
        int32_t          device_splits = 0, cpu_inputs = 0;
        for (std::sregex_iterator it(g_splits.text.begin(), g_splits.text.end(), split), end; it != end; ++it) {
            ((*it)[1] == "CPU" ? cpu_inputs : device_splits) += (*it)[1] == "CPU" ? std::stoi((*it)[2]) : 1;
        }
        EXPECT_GE(device_splits, 3);  // each token's graph (not reused: LLAMA_GRAPH_REUSE_DISABLE)
        EXPECT_EQ(cpu_inputs, 0) << g_splits.text;
    }
    unsetenv("GGML_SCHED_DEBUG");
    unsetenv("LLAMA_GRAPH_REUSE_DISABLE");
}

TEST(session, errors_are_clear) {
    const fixture f;
    auto          message = [](auto && fn) {
        try {
            fn();
        } catch (const ecokv::error & e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    const int32_t n_train = f.m.config().n_ctx_train;
    EXPECT_EQ(message([&] { f.s.prefill(f.s.make_prompt(prompt_tokens(40, 100, 1)), n_train, window(0)); }),
              "prompt of 40 tokens plus " + std::to_string(n_train) + " new ones exceeds the model's context of " +
                  std::to_string(n_train));
    const el::sequence bare = f.s.prefill(f.s.make_prompt(prompt_tokens(40, 100, 1)), 4, window(0));
    EXPECT_NE(message([&] { bare.compress(ecokv::parse_method("snapkv"), budget(16), 4); }).find("no prefill capture"),
              std::string::npos);
    EXPECT_EQ(message([&] { f.s.make_prompt("x", { "img.png" }); }), "images need a projector (--mmproj)");
    EXPECT_EQ(message([&] { el::session(el::session_options{}); }), ": no such model file");
}

}  // namespace
