// ecokv eval: a needle-in-a-haystack generator for text models, in the form of RULER's niah_single tasks
// (Hsieh et al., "RULER: What's the Real Context Size of Your Long-Context Language Models?", arXiv 2404.06654;
// scripts/data/synthetic/niah.py): the needle "The special magic number for <key> is <number>." sits among
// filler sentences, the question asks for the number.
//
// Choices (RULER deviations on purpose, so that the items need no download and suit tiny models):
// - The filler is generated from a small fixed vocabulary of TinyStories-like sentences (RULER repeats "The grass
//   is green. ..." or uses Paul Graham essays), or read from params.haystack_file.
// - Lengths are counted in words, not tokens: no tokenizer is involved, so the items do not depend on the model.
// - Keys are "<adjective>-<noun>" (RULER draws random words); numbers have 7 digits, as RULER's.
// - The needle goes to the sentence boundary nearest the requested depth (RULER: the boundary found by
//   inserting at a token position and backing off to the preceding sentence end).
// - No instruction text in the context ("Some special magic numbers are hidden ..."): prompts belong to the
//   runner. The config file niah.json, if any, sets niah_params; "haystack_file" is relative to its directory.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"
#include "ecokv/hash.h"

#include <cmath>
#include <fstream>
#include <sstream>

namespace ecokv {

void niah_params::validate() const {
    auto at_least = [](const char * name, int64_t v, int64_t lo) {
        if (v < lo) {
            throw error("niah: " + std::string(name) + " " + std::to_string(v) + " must be at least " +
                        std::to_string(lo));
        }
    };
    at_least("count", count, 1);
    at_least("context_words", context_words, 1);
    at_least("n_lengths", n_lengths, 1);
    at_least("n_depths", n_depths, 1);
    // Bounded before anything is generated: every item is made (and held) at load time.
    auto at_most = [](const char * name, int64_t v, int64_t hi) {
        if (v > hi) {
            throw error("niah: " + std::string(name) + " " + std::to_string(v) + " must be at most " + std::to_string(hi));
        }
    };
    at_most("count", count, 100000);
    at_most("context_words", context_words, 1000000);
    at_most("count x context_words", int64_t(count) * context_words, 50000000);
    if (n_lengths > context_words) {
        throw error("niah: n_lengths " + std::to_string(n_lengths) + " must not exceed context_words " +
                    std::to_string(context_words));
    }
}

namespace {

using detail::fs::path;

// A counter-based stream: the same (seed, item) gives the same draws whatever else is generated.
struct draw {
    uint64_t ctr;
    uint64_t next() { return splitmix64(ctr++); }
    size_t   below(size_t n) { return size_t(next() % n); }
};

const char * const k_subjects[] = { "The little dog", "A small bird",  "The old man",   "Lily",
                                    "Tom",            "The happy cat", "A big bear",    "The kind girl",
                                    "Mom",            "The tall tree", "A tiny mouse",  "The red car" };
const char * const k_predicates[] = { "walked to the park",      "saw a shiny ball",      "played in the garden",
                                      "ate a sweet apple",       "looked at the blue sky", "sang a happy song",
                                      "found a round stone",     "ran by the river",       "slept under the bed",
                                      "jumped over the fence",   "waited for the bus",     "drew a big house" };
const char * const k_tails[]      = { "", " with a friend", " in the morning", " after lunch", " every day",
                                      " in the rain", " near the school", " before dinner" };
const char * const k_adjectives[] = { "amber",  "brave", "calm",   "dusty", "eager", "fuzzy", "gentle", "hollow",
                                      "icy",    "jolly", "lucky",  "misty", "noble", "quiet", "rusty",  "silver" };
const char * const k_nouns[]      = { "anchor", "badge",   "candle", "dragon", "engine",  "feather",
                                      "garden", "harbor",  "island", "jacket", "kettle",  "lantern",
                                      "meadow", "orchard", "pepper", "window" };

template <size_t N>
const char * pick(draw & d, const char * const (&list)[N]) {
    return list[d.below(N)];
}

size_t word_count(const std::string & s) {
    std::istringstream in(s);
    size_t             n = 0;
    for (std::string w; in >> w;) {
        ++n;
    }
    return n;
}

// Sentences of a text file: whitespace collapsed, split after '.', '!' or '?' (and closing quotes) before a space.
std::vector<std::string> read_sentences(const std::string & file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
        throw error(file + ": cannot open the niah haystack file");
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    std::vector<std::string> out;
    std::string              cur, word;
    std::istringstream       words(ss.str());
    while (words >> word) {
        cur += (cur.empty() ? "" : " ") + word;
        const size_t end = word.find_last_not_of("\"')");
        if (end != std::string::npos && std::string_view(".!?").find(word[end]) != std::string_view::npos) {
            out.push_back(std::move(cur));
            cur.clear();
        }
    }
    if (!cur.empty()) {
        out.push_back(std::move(cur));
    }
    if (out.empty()) {
        throw error(file + ": the niah haystack file has no text");
    }
    return out;
}

eval_item make_item(const niah_params & p, const std::vector<std::string> & file_sentences, int32_t i) {
    draw           d{ splitmix64(p.seed ^ splitmix64(uint64_t(i))) };
    const int32_t  il     = (i / p.n_depths) % p.n_lengths;
    const int32_t  idep   = i % p.n_depths;
    const size_t   target = size_t(int64_t(p.context_words) * (il + 1) / p.n_lengths);
    const double   depth  = p.n_depths == 1 ? 0.5 : double(idep) / double(p.n_depths - 1);

    // Whole sentences up to the target length (at least one).
    std::vector<std::string> sentences;
    std::vector<size_t>      words_before = { 0 };  // [n_sentences + 1]: words before each boundary
    size_t                   next_file    = file_sentences.empty() ? 0 : d.below(file_sentences.size());
    for (;;) {
        std::string s;
        if (file_sentences.empty()) {
            s = std::string(pick(d, k_subjects)) + " " + pick(d, k_predicates) + pick(d, k_tails) + ".";
        } else {
            s         = file_sentences[next_file];
            next_file = (next_file + 1) % file_sentences.size();
        }
        const size_t n = word_count(s);
        if (!sentences.empty() && words_before.back() + n > target) {
            break;
        }
        sentences.push_back(std::move(s));
        words_before.push_back(words_before.back() + n);
    }

    // The boundary nearest depth * words (ties to the earlier one).
    const double want = depth * double(words_before.back());
    size_t       at   = 0;
    for (size_t b = 1; b < words_before.size(); ++b) {
        if (std::abs(double(words_before[b]) - want) < std::abs(double(words_before[at]) - want)) {
            at = b;
        }
    }

    const std::string key    = std::string(pick(d, k_adjectives)) + "-" + pick(d, k_nouns);
    const std::string number = std::to_string(1000000 + d.below(9000000));
    const std::string needle = "The special magic number for " + key + " is " + number + ".";
    eval_item         it;
    for (size_t s = 0; s <= sentences.size(); ++s) {
        if (s == at) {
            it.context += (it.context.empty() ? "" : " ") + needle;
        }
        if (s < sentences.size()) {
            it.context += (it.context.empty() ? "" : " ") + sentences[s];
        }
    }
    it.id       = "niah-" + std::to_string(i);
    it.question = "What is the special magic number for " + key + "?";
    it.answers  = { number };
    it.type     = "words=" + std::to_string(target) + " depth=" + std::to_string(int(std::lround(depth * 100))) + "%";
    return it;
}

}  // namespace

std::vector<eval_item> make_niah(const niah_params & params) {
    params.validate();
    const std::vector<std::string> file_sentences =
        params.haystack_file.empty() ? std::vector<std::string>{} : read_sentences(params.haystack_file);
    std::vector<eval_item> items;
    for (int32_t i = 0; i < params.count; ++i) {
        items.push_back(make_item(params, file_sentences, i));
    }
    return items;
}

namespace detail {

std::vector<eval_item> load_niah(const fs::path & dir) {
    niah_params p;
    if (dir.empty() || !fs::exists(dir / "niah.json")) {
        return make_niah(p);
    }
    const fs::path file = dir / "niah.json";
    const json     cfg  = read_json(file);
    if (!cfg.is_object()) {
        throw error(file.string() + ": expected an object of niah parameters, not " + cfg.type_name());
    }
    for (const auto & [key, v] : cfg.items()) {
        const std::string where = file.string() + ": \"" + key + "\"";
        if (key == "haystack_file") {
            p.haystack_file = resolve_image(dir, string_member(cfg, "haystack_file", file.string()), where, "path");
            continue;
        }
        int32_t * field = key == "count"         ? &p.count :
                          key == "context_words" ? &p.context_words :
                          key == "n_lengths"     ? &p.n_lengths :
                          key == "n_depths"      ? &p.n_depths :
                                                   nullptr;
        if (!field && key != "seed") {
            throw error(where + ": unknown key; known: seed, count, context_words, n_lengths, n_depths, haystack_file");
        }
        if (!v.is_number_integer()) {
            throw error(where + " must be an integer, not " + v.dump());
        }
        if (!field) {
            if (!v.is_number_unsigned()) {
                throw error(where + " must not be negative");
            }
            p.seed = v.get<uint64_t>();
        } else if (v.is_number_unsigned() ? v.get<uint64_t>() > INT32_MAX : v.get<int64_t>() < INT32_MIN) {
            throw error(where + " " + v.dump() + " is out of range");
        } else {
            *field = int32_t(v.get<int64_t>());
        }
    }
    try {
        p.validate();
    } catch (const error & e) {
        throw error(file.string() + ": " + e.what());
    }
    return make_niah(p);
}

}  // namespace detail

}  // namespace ecokv
