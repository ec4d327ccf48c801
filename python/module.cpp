// The Python module `ecokv` (issue 47): the registry, the option table and the methods over arrays, as kvpress's users
// hold them ([layers, kv_heads, tokens, head_dim], float32 or float16, anything with the buffer protocol: numpy arrays,
// torch CPU tensors through .numpy()). Arrays are read in place through strided views (no copy); the GIL is released
// while a method runs. Errors are the library's messages: ValueError for shapes and options, OSError for files.
#include "ecokv/capture.h"
#include "ecokv/compress.h"
#include "ecokv/error.h"
#include "ecokv/options.h"
#include "options.h"
#include "session.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>

namespace py = pybind11;

namespace {

// A [layers, heads, tokens, dim] array as one tensor_view a layer: the layer's [heads][tokens][dim] slice with the
// array's own strides. Rows (dim) must be contiguous, as the core reads them.
std::vector<ecokv::tensor_view> layer_views(const py::buffer_info & b, const char * name) {
    if (b.ndim != 4) {
        throw py::value_error(std::string(name) + " must have 4 dimensions [layers, heads, tokens, head_dim], not " +
                              std::to_string(b.ndim));
    }
    ecokv::dtype type;
    if (b.format == py::format_descriptor<float>::format() && b.itemsize == 4) {
        type = ecokv::dtype::f32;
    } else if (b.format == "e" && b.itemsize == 2) {
        type = ecokv::dtype::f16;
    } else {
        throw py::value_error(std::string(name) + " must be float32 or float16, not '" + b.format + "'");
    }
    if (b.strides[3] != b.itemsize || b.strides[0] < 0 || b.strides[1] < 0 || b.strides[2] < 0) {
        throw py::value_error(std::string(name) + "'s last dimension must be contiguous (np.ascontiguousarray)");
    }
    std::vector<ecokv::tensor_view> out;
    for (py::ssize_t l = 0; l < b.shape[0]; ++l) {
        ecokv::tensor_view v;
        v.data = static_cast<const char *>(b.ptr) + l * b.strides[0];
        v.type = type;
        v.ne   = { b.shape[3], b.shape[2], b.shape[1], 1 };
        v.nb   = { size_t(b.itemsize), size_t(b.strides[2]), size_t(b.strides[1]), size_t(b.strides[1] * b.shape[1]) };
        out.push_back(v);
    }
    return out;
}

// The core's own time in the last select() (the C++ call, without the binding), for bench/bench-python-select.py.
std::atomic<double> g_last_select_seconds{ 0 };

// An array argument as a buffer: numpy arrays and other buffers as they are; a DLPack producer (torch, JAX, CuPy...)
// through numpy.from_dlpack, anything else numpy can view through numpy.asarray; neither copies a CPU array.
py::buffer as_buffer(const py::object & o, const char * name) {
    if (py::isinstance<py::buffer>(o)) {
        return o.cast<py::buffer>();
    }
    try {
        const py::module_ np = py::module_::import("numpy");
        if (py::hasattr(o, "__dlpack__")) {
            return np.attr("from_dlpack")(o).cast<py::buffer>();
        }
        return np.attr("asarray")(o).cast<py::buffer>();
    } catch (const py::error_already_set &) {
        throw py::value_error(std::string(name) + " must be a CPU array (numpy, DLPack, a buffer)");
    }
}

py::list select_tokens(const py::object & keys_in, const py::object & queries_in, const py::object & values,
                       const py::object & modality, const py::object & full_queries, const py::kwargs & options) {
    const ecokv::compression c    = ecokv::python::compression_of(options);
    const py::buffer         keys = as_buffer(keys_in, "keys"), queries = as_buffer(queries_in, "queries");
    const py::buffer_info    k = keys.request(), q = queries.request();
    std::optional<py::buffer>      vb, fb;  // kept alive while their views are read
    std::optional<py::buffer_info> v;
    if (!values.is_none()) {
        vb = as_buffer(values, "values");
        v  = vb->request();
    }
    const auto kl = layer_views(k, "keys"), ql = layer_views(q, "queries");
    ecokv::capture_view cap;
    cap.n_layers   = int32_t(k.shape[0]);
    cap.n_kv_heads = int32_t(k.shape[1]);
    cap.n_tokens   = int32_t(k.shape[2]);
    cap.head_dim   = int32_t(k.shape[3]);
    cap.n_heads    = q.ndim == 4 ? int32_t(q.shape[1]) : 0;
    cap.n_queries  = q.ndim == 4 ? int32_t(q.shape[2]) : 0;
    cap.head_dim_v = v ? int32_t(v->shape[3]) : cap.head_dim;
    const auto vl  = v ? layer_views(*v, "values") : std::vector<ecokv::tensor_view>{};
    std::optional<py::buffer_info> fq;  // every prompt token's queries (H2O, LOOK-M)
    if (!full_queries.is_none()) {
        fb = as_buffer(full_queries, "full_queries");
        fq = fb->request();
    }
    const auto fl = fq ? layer_views(*fq, "full_queries") : std::vector<ecokv::tensor_view>{};
    if (!modality.is_none()) {  // per token: 0 text, 1 image, 2 audio
        const auto m = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(modality);
        if (!m || m.ndim() != 1) {
            throw py::value_error("modality must be a 1-d array of 0 (text), 1 (image) or 2 (audio) per token");
        }
        cap.modality.assign(m.data(), m.data() + m.size());
    }
    if (q.shape[0] != k.shape[0] || (v && v->shape[0] != k.shape[0]) || (fq && fq->shape[0] != k.shape[0])) {
        throw py::value_error("keys, queries and values must have as many layers");
    }
    for (int32_t l = 0; l < cap.n_layers; ++l) {
        ecokv::tensor_view shape_only = kl[size_t(l)];  // values absent: their shape, no data (has_values() false)
        shape_only.data               = nullptr;
        cap.layers.push_back({ kl[size_t(l)], v ? vl[size_t(l)] : shape_only, ql[size_t(l)],
                               fq ? fl[size_t(l)] : ecokv::tensor_view{} });
    }
    ecokv::selection sel;
    {
        const py::gil_scoped_release unlocked;
        const auto                   t0 = std::chrono::steady_clock::now();
        sel = ecokv::compress(cap, c.spec, c.params);
        g_last_select_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    py::list layers;
    for (const auto & layer : sel.layers) {
        py::list heads;
        for (const ecokv::head_selection & h : layer) {
            heads.append(py::array_t<int32_t>(py::ssize_t(h.kept.size()), h.kept.data()));
        }
        layers.append(heads);
    }
    return layers;
}

// A SPEC §7 capture file's tensors as arrays [layers, heads, tokens, head_dim] (copies). A missing or bad file is an
// OSError with the library's message.
py::dict load_capture(const std::string & path) {
    std::optional<ecokv::capture_file> opened;
    try {
        opened.emplace(ecokv::capture_file::open(path));
    } catch (const ecokv::error & e) {
        PyErr_SetString(std::filesystem::exists(path) ? PyExc_OSError : PyExc_FileNotFoundError, e.what());
        throw py::error_already_set();
    }
    const ecokv::capture_file & file = *opened;
    const ecokv::capture_view & cap = file.view();
    const auto stack = [&](auto member, int64_t heads, int64_t rows, int64_t dim) {
        py::array_t<float> out({ int64_t(cap.n_layers), heads, rows, dim });
        float *            at = out.mutable_data();
        for (const ecokv::layer_capture & l : cap.layers) {
            const ecokv::tensor_view & t = l.*member;
            for (int64_t h = 0; h < heads; ++h) {
                for (int64_t r = 0; r < rows; ++r, at += dim) {
                    t.row_f32(r, h, at);
                }
            }
        }
        return out;
    };
    py::dict out(py::arg("keys") = stack(&ecokv::layer_capture::keys, cap.n_kv_heads, cap.n_tokens, cap.head_dim),
                 py::arg("values") = stack(&ecokv::layer_capture::values, cap.n_kv_heads, cap.n_tokens, cap.head_dim_v),
                 py::arg("queries") = stack(&ecokv::layer_capture::queries, cap.n_heads, cap.n_queries, cap.head_dim));
    if (cap.has_full_queries()) {
        out["full_queries"] = stack(&ecokv::layer_capture::full_queries, cap.n_heads, cap.n_tokens, cap.head_dim);
    }
    if (!cap.modality.empty()) {
        out["modality"] = py::array_t<uint8_t>(py::ssize_t(cap.modality.size()), cap.modality.data());
    }
    return out;
}

// select()'s docstring: its summary, then every method option of the table (key, default, help), so that help()
// says what the command line's --help says.
const char * select_doc() {
    static const std::string doc = [] {
        std::string d = "The tokens each (layer, KV head) keeps: keys [layers, kv_heads, tokens, head_dim] (post-RoPE), "
                        "the window's queries [layers, heads, n_queries, head_dim], values [layers, kv_heads, tokens, "
                        "head_dim_v] when the method reads them, modality [tokens] (0 text, 1 image; MadaKV, LOOK-M) "
                        "and full_queries [layers, heads, tokens, head_dim] (H2O, LOOK-M) where needed. Returns "
                        "[layer][head] int32 arrays of ascending token indices, as `ecokv compress` selects.\n\n"
                        "Options (the option table's rows):\n";
        for (const ecokv::option_info & o : ecokv::compression_options()) {
            if (o.scope & ecokv::scope_method) {
                const std::string def = ecokv::option_text(ecokv::get_option(ecokv::compression{}, o.key));
                d += "  " + std::string(o.key) + " (default: " + (def.empty() ? std::string(o.unset) : def) + "): " +
                     std::string(o.help) + "\n";
            }
        }
        return d;
    }();
    return doc.c_str();
}

}  // namespace

PYBIND11_MODULE(ecokv, m) {
    m.doc() = "ecokv: KV cache compression methods (ECOKV, MadaKV and their baselines) over arrays.";
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const ecokv::error & e) {  // option_error included: a bad option, shape or value
            PyErr_SetString(PyExc_ValueError, e.what());
        }
    });
    m.def(
        "methods",
        [] {
            py::list out;
            for (const ecokv::method_info & i : ecokv::list_methods()) {
                out.append(py::dict(py::arg("name") = i.name, py::arg("kind") = i.kind,
                                    py::arg("description") = i.description, py::arg("defaults") = i.defaults));
            }
            return out;
        },
        "The registry's scorers and allocators, as `ecokv compress --list-methods` prints them.");
    m.def(
        "options",
        [] {
            py::list out;
            for (const ecokv::option_info & o : ecokv::compression_options()) {
                if (!(o.scope & ecokv::scope_method)) {
                    continue;
                }
                py::list choices;
                for (const std::string_view c : o.choices) {
                    choices.append(std::string(c));
                }
                out.append(py::dict(py::arg("key") = std::string(o.key), py::arg("help") = std::string(o.help),
                                    py::arg("default") = ecokv::option_text(ecokv::get_option(ecokv::compression{}, o.key)),
                                    py::arg("unset") = std::string(o.unset), py::arg("choices") = choices));
            }
            return out;
        },
        "The method options of the option table (the CLI's flags, the server's kv_compression fields): key, help, "
        "default, choices.");
    m.def("select", &select_tokens, py::arg("keys"), py::arg("queries"), py::kw_only(), py::arg("values") = py::none(),
          py::arg("modality") = py::none(), py::arg("full_queries") = py::none(),
          select_doc());
#if ECOKV_PYTHON_SESSION
    add_session(m);
#endif
    m.def(
        "last_select_seconds", [] { return g_last_select_seconds.load(); },
        "Seconds the core's compress() took in the last select(), without the binding's work (for benchmarks).");
    m.def("load_capture", &load_capture, py::arg("path"),
          "A capture file (SPEC §7 safetensors) as a dict of float32 arrays: keys, values, queries, and full_queries "
          "and modality (uint8) when it holds them.");
}
