// ecokv.Model and ecokv.Sequence: the llama.cpp session from Python (issue 47), "compress once, ask many" as kvpress
// frames it: a prompt (text and images) prefilled once, compressed by any method, then questions answered on the
// compressed cache, each from the same state (sequence::rewind).
#include "session.h"

#include "options.h"

#include "ecokv/error.h"
#include "ecokv/llama-entry.h"
#include "ecokv/llama-generate.h"
#include "ecokv/llama-options.h"
#include "ecokv/llama-session.h"
#include "ecokv/options.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <optional>
#include <random>

namespace py = pybind11;
namespace el = ecokv::llama;

namespace {

// Window queries a prefill keeps for compress(): more than any scorer's default window (32).
constexpr int32_t k_captured_queries = 64;

// llama-cpp-python's argument names of the engine table's rows: (table key, its name).
constexpr std::pair<const char *, const char *> k_engine_aliases[] = {
    { "ctx_size", "n_ctx" },      { "threads", "n_threads" },       { "threads_batch", "n_threads_batch" },
    { "batch_size", "n_batch" },  { "ubatch_size", "n_ubatch" },    { "cache_type_k", "type_k" },
    { "cache_type_v", "type_v" },
};

std::string engine_key(const std::string & name) {
    for (const auto & [key, alias] : k_engine_aliases) {
        if (name == alias) {
            return key;
        }
    }
    return name;
}

// Model's docstring: the engine table's rows (key, default, help), with llama-cpp-python's spellings where it has one.
const char * model_doc() {
    static const std::string doc = [] {
        std::string d = "Loads the model (and projector); llama.cpp's log is quiet unless verbose=True. Engine options "
                        "(the engine table's rows, as `ecokv run --help`):\n";
        for (const el::engine_option & o : el::engine_options()) {
            std::string name(o.key);
            for (const auto & [key, alias] : k_engine_aliases) {
                if (name == key) {
                    name = std::string(alias) + " (or " + key + ")";
                }
            }
            d += "  " + name + ": " + std::string(o.help) + "\n";
        }
        return d + "  n_seq_max: 1 only (a Sequence holds its own context)\n";
    }();
    return doc.c_str();
}

struct model {
    std::shared_ptr<el::session> s;
    el::prompt_parts             parts_of(const std::string & text) const { return s->split_prompt(text); }
};

struct sequence {
    std::shared_ptr<el::session> s;        // kept alive while a sequence lives
    std::shared_ptr<el::sequence> seq;
    std::shared_ptr<el::prompt>   prompt;  // the prefill's (compress() needs it for nothing but its cells)
    std::string                   suffix;  // the chat template's text after a question
    int32_t                       n_extra = 0;
};

sequence prefill(const model & m, const std::string & text, const std::vector<std::string> & images,
                 int32_t max_tokens, const py::kwargs & options) {
    const el::prompt_parts parts = m.parts_of(el::with_media_markers(text, images.size()));
    auto                   p     = std::make_shared<el::prompt>(m.s->make_prompt(parts.context, images));
    const int32_t          n_extra = max_tokens + 64;  // the answer and a question of up to 64 tokens
    std::shared_ptr<el::sequence> seq;
    {
        const ecokv::compression c = options.empty() ? ecokv::compression{} : ecokv::python::compression_of(options);
        const py::gil_scoped_release unlocked;
        if (options.empty()) {  // the full cache, with what compress() needs to make any method from it
            ecokv::method_requirements needs;
            needs.n_window_queries = k_captured_queries;
            needs.values           = true;
            seq = std::make_shared<el::sequence>(m.s->prefill(*p, n_extra, needs));
        } else {
            el::check_prompt_window(p->n_cells(), c);
            seq = std::make_shared<el::sequence>(m.s->prefill(*p, c, n_extra));
        }
    }
    return { m.s, seq, p, parts.question_suffix, n_extra };
}

sequence compress(const sequence & full, const py::kwargs & options) {
    const ecokv::compression c = ecokv::python::compression_of(options);
    if (!el::compressible_by_copy(c)) {
        throw ecokv::error("compress() makes one-shot compressions; pass a chunked or re-compressing one to prefill()");
    }
    const py::gil_scoped_release unlocked;
    auto seq = std::make_shared<el::sequence>(full.seq->compress(c.spec, c.params, full.n_extra));
    return { full.s, seq, full.prompt, full.suffix, full.n_extra };
}

std::vector<llama_token> question_tokens(const sequence & q, const std::string & question, int32_t max_tokens) {
    std::vector<llama_token> tokens = q.s->tokenize(question + q.suffix, false);
    if (int32_t(tokens.size()) + max_tokens > q.n_extra) {
        throw ecokv::error("the question (" + std::to_string(tokens.size()) + " tokens) and max_tokens (" +
                           std::to_string(max_tokens) + ") exceed the room left at prefill (" +
                           std::to_string(q.n_extra) + "): prefill with a larger max_tokens");
    }
    return tokens;
}

// An answer token by token, sampled at a temperature (0: greedy, as ask()): the pieces of text as they are made,
// a piece held back while it ends inside a UTF-8 character.
struct answer_stream {
    sequence                 q;
    std::vector<llama_token> question, out;
    int32_t                  max_tokens = 0;
    double                   temperature = 0;
    std::mt19937_64          rng;
    size_t                   sent = 0;
    bool                     started = false, done = false;

    std::string next() {
        while (!done) {
            {
                const py::gil_scoped_release unlocked;
                if (!started) {
                    q.seq->rewind();
                    q.seq->decode(question);
                    started = true;
                } else {
                    q.seq->decode({ out.back() });
                }
            }
            const llama_token t = el::pick_token(q.seq->logits(), temperature, rng);
            if (q.s->is_end_of_generation(t)) {
                done = true;
                break;
            }
            out.push_back(t);
            done = int32_t(out.size()) >= max_tokens;
            const std::string text = q.s->detokenize(out);
            size_t            ready = text.size();
            while (ready > sent && !done && (uint8_t(text[ready - 1]) & 0xC0) == 0x80) {
                --ready;  // a continuation byte at the end: its character may go on
            }
            if (ready > sent && !done && uint8_t(text[ready - 1]) >= 0xC0) {
                --ready;  // a lead byte whose continuation is still to come
            }
            if (ready > sent) {
                std::string piece = text.substr(sent, ready - sent);
                sent              = ready;
                return piece;
            }
        }
        const std::string text = q.s->detokenize(out);
        if (sent < text.size()) {
            std::string rest = text.substr(sent);
            sent             = text.size();
            return rest;
        }
        throw py::stop_iteration();
    }
};

std::string ask_one(const sequence & q, const std::string & question, int32_t max_tokens, double temperature,
                    uint64_t seed) {
    const std::vector<llama_token> tokens = question_tokens(q, question, max_tokens);
    if (temperature > 0) {
        answer_stream s{ q, tokens, {}, max_tokens, temperature, std::mt19937_64(seed) };
        std::string   text;
        try {
            for (;;) {
                text += s.next();
            }
        } catch (const py::stop_iteration &) {
        }
        return text;
    }
    el::generation g;
    {
        const py::gil_scoped_release unlocked;
        q.seq->rewind();  // every question from the state after the prompt (and its compression)
        g = q.seq->answer(tokens, max_tokens);
    }
    std::vector<llama_token> out = g.tokens;
    while (!out.empty() && q.s->is_end_of_generation(out.back())) {
        out.pop_back();
    }
    return q.s->detokenize(out);
}

// The sequence as an entry (ecokv/llama-entry.h): checked whole when read back, by this model only.
py::bytes save(const sequence & q) {
    const el::entry_header h{ q.s->fingerprint(), q.s->cache_shape(),
                              q.seq->kept_cells().empty() ? std::string(ecokv::k_full_cache)
                                                          : q.seq->held_compression().key() };
    const std::vector<uint8_t> bytes = el::encode_entry({ h, {}, q.seq->save() });
    return { reinterpret_cast<const char *>(bytes.data()), bytes.size() };
}

sequence resume(const model & m, const py::bytes & saved, int32_t max_tokens) {
    const std::string_view raw = saved;
    const el::entry        e   = el::decode_entry_for(
        { reinterpret_cast<const uint8_t *>(raw.data()), raw.size() }, { m.s->fingerprint(), m.s->cache_shape(), "" });
    const int32_t n_extra = max_tokens + 64;
    const py::gil_scoped_release unlocked;
    auto seq = std::make_shared<el::sequence>(m.s->resume(e.snap, ecokv::compression::none(), n_extra));
    return { m.s, seq, nullptr, m.parts_of("").question_suffix, n_extra };
}

}  // namespace

void add_session(py::module_ & m) {
    py::class_<answer_stream>(m, "AnswerStream", "The pieces of an answer as they are decoded (Sequence.ask(stream=True)).")
        .def("__iter__", [](answer_stream & s) -> answer_stream & { return s; })
        .def("__next__", &answer_stream::next);
    py::class_<sequence>(m, "Sequence", "A prefilled prompt's KV cache, full or compressed.")
        .def("compress", &compress,
             "A compressed copy of this full-cache sequence: options by the table's keys (method=, budget=, ...).")
        .def(
            "ask",
            [](const sequence & q, const py::object & questions, int32_t max_tokens, double temperature, uint64_t seed,
               bool stream) -> py::object {
                if (stream) {
                    if (!py::isinstance<py::str>(questions)) {
                        throw py::value_error("stream=True answers one question at a time");
                    }
                    const std::string question = questions.cast<std::string>();
                    return py::cast(answer_stream{ q, question_tokens(q, question, max_tokens), {}, max_tokens,
                                                   temperature, std::mt19937_64(seed) });
                }
                if (py::isinstance<py::str>(questions)) {
                    return py::str(ask_one(q, questions.cast<std::string>(), max_tokens, temperature, seed));
                }
                py::list out;
                for (const py::handle & one : questions) {
                    out.append(ask_one(q, one.cast<std::string>(), max_tokens, temperature, seed));
                }
                return out;
            },
            py::arg("question"), py::arg("max_tokens") = 32, py::arg("temperature") = 0.0, py::arg("seed") = 0,
            py::arg("stream") = false,
            "The answer(s) to a question or a list of questions, each asked of the state after the prompt: greedy, "
            "or sampled at `temperature` (seeded). stream=True: an iterator of the answer's text pieces.")
        .def_property_readonly("kv_bytes", [](const sequence & q) { return q.seq->kv_bytes_kept(); },
                               "KV bytes the cache holds (kept entries x bytes per entry; all cells when full).")
        .def_property_readonly("n_cells", [](const sequence & q) { return q.seq->n_prompt(); })
        .def("save", &save, "The cache as bytes (ecokv's checked entry format), for Model.resume().")
        .def(
            "kept",
            [](const sequence & q) -> py::object {
                const auto & kept = q.seq->kept_cells();
                if (kept.empty()) {
                    return py::none();
                }
                const int32_t n_kv = llama_model_n_head_kv(q.s->model());
                py::list      layers;
                for (size_t h = 0; h < kept.size(); ++h) {
                    if (h % size_t(n_kv) == 0) {
                        layers.append(py::list());
                    }
                    layers[layers.size() - 1].cast<py::list>().append(
                        py::array_t<int32_t>(py::ssize_t(kept[h].size()), kept[h].data()));
                }
                return layers;
            },
            "[layer][head] int32 arrays of the prompt cells each KV head kept; None for a full cache.");
    py::class_<model>(m, "Model", "A GGUF model (and projector) loaded by llama.cpp.")
        .def(py::init([](const std::string & path, const std::optional<std::string> & mmproj, bool verbose,
                         const py::kwargs & engine) {
                 el::set_verbose(verbose);  // llama.cpp's log, quiet unless asked (the CLI's --verbose)
                 el::session_options o;
                 o.model_path  = path;
                 o.mmproj_path = mmproj.value_or("");
                 o.n_gpu_layers = 0;
                 for (const auto & [k, v] : engine) {
                     const std::string key = engine_key(std::string(py::str(k)));
                     if (key == "n_seq_max") {  // llama-cpp-python's: a sequence is one context here
                         if (!py::isinstance<py::int_>(v) || v.cast<int64_t>() != 1) {
                             throw py::value_error("n_seq_max must be 1: each Sequence holds its own context "
                                                   "(continuous batching of many is issue 50)");
                         }
                         continue;
                     }
                     el::set_engine_option(o, key, ecokv::python::option_value_of(v));
                 }
                 const py::gil_scoped_release unlocked;
                 return model{ std::make_shared<el::session>(o) };
             }),
             py::arg("path"), py::arg("mmproj") = py::none(), py::arg("verbose") = false, model_doc())
        .def("resume", &resume, py::arg("saved"), py::kw_only(), py::arg("max_tokens") = 32,
             "A sequence from Sequence.save()'s bytes, checked whole first: another model's, a corrupted or truncated "
             "entry is a ValueError.")
        .def("prefill", &prefill, py::arg("prompt"), py::arg("images") = std::vector<std::string>{},
             py::kw_only(), py::arg("max_tokens") = 32,
             "Prefills the context (text; images as file paths, placed first unless the text holds markers). With "
             "compression options (method=, budget=, chunk=, ...) the cache is compressed as `ecokv run` does; "
             "without, it stays full and compress() makes any method from it.");
}
