// The evaluation runner (ecokv/eval-runner.h): plan (every check before any engine work), then one prefill per item
// and one JSON record per (item, method, budget), flushed as it comes.
#include "ecokv/eval-runner.h"

#include "ecokv/error.h"
#include "ecokv/hash.h"
#include "ecokv/safetensors.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>

namespace ecokv {

namespace {

using json   = nlohmann::json;
namespace fs = std::filesystem;

const char * mode_name(eval_mode m) { return m == eval_mode::prompt ? "prompt" : "agnostic"; }

std::string key(const std::string & id, const std::string & method, int32_t budget) {
    return id + "\x1f" + method + "\x1f" + std::to_string(budget);
}

// A 64-bit hash of bytes, 8 at a time through splitmix64: the same on every platform.
uint64_t hash_bytes(const char * data, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        std::memcpy(&w, data + i, std::min<size_t>(8, n - i));
        h = splitmix64(h ^ w);
    }
    return splitmix64(h ^ n);
}

std::string hex(uint64_t h) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long) h);
    return buf;
}

// Content hash of a file, so that a resume with another model or projector of the same name is refused. Reads the
// file once (a few seconds for a multi-GB model).
std::string content_hash(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw error(path + ": cannot read");
    }
    uint64_t          h = 0x9e3779b97f4a7c15ull;
    std::vector<char> buf(1 << 20);
    while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0) {
        h = hash_bytes(buf.data(), size_t(in.gcount()), h);
    }
    return hex(h);
}

// An exclusive flock on <dir>/lock holding the writer's pid. The kernel drops it when the process dies, so a lock
// file left by a killed run is simply taken over.
std::shared_ptr<void> lock_dir(const std::string & dir) {
    const std::string path = dir + "/lock";
    const int         fd   = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        throw error(path + ": cannot open: " + std::strerror(errno));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char          pid[32] = {};
        const ssize_t n       = ::pread(fd, pid, sizeof pid - 1, 0);
        ::close(fd);
        throw error(dir + " is being written by another ecokv eval (pid " + std::string(pid, size_t(std::max<ssize_t>(n, 0))) +
                    "); wait for it or use another --out");
    }
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
        ::close(fd);
        throw error(path + ": cannot write: " + std::strerror(errno));
    }
    return std::shared_ptr<void>(nullptr, [fd](void *) { ::close(fd); });
}

json value_json(const option_value & v) {
    if (const int64_t * i = std::get_if<int64_t>(&v)) {
        return *i;
    }
    if (const double * d = std::get_if<double>(&v)) {
        return *d;
    }
    if (const std::string * t = std::get_if<std::string>(&v)) {
        return *t;
    }
    return nullptr;
}

// Every option that changes results, from the option tables. Method options are recorded even when no method reads
// them: a run's config is then a plain function of its options. Files are recorded by content hash.
json config_of(const eval_options & o, const metric_info & metric) {
    json config = {
        { "dataset", o.dataset },
        { "metric", metric.name },
        { "mode", mode_name(o.mode) },
        { "model", fs::path(o.model).filename().string() },
        { "model_hash", content_hash(o.model) },
        { "mmproj", o.projector.empty() ? json(nullptr) : json(fs::path(o.projector).filename().string()) },
        { "mmproj_hash", o.projector.empty() ? json(nullptr) : json(content_hash(o.projector)) },
        { "n_predict", o.n_predict },
    };
    if (o.turns) {  // recorded only when on: directories written before --turns existed resume
        config["turns"] = true;
    }
    static const compression defaults;
    for (const option_info & row : compression_options()) {
        const option_value v = row.get(row, o.settings);
        if (row.record == option_record::never ||
            (row.record == option_record::unless_default && v == row.get(row, defaults))) {
            continue;
        }
        const bool file   = row.kind == option_kind::path && std::holds_alternative<std::string>(v);
        config[row.key] = file ? json(content_hash(std::get<std::string>(v))) : value_json(v);
    }
    for (const auto & [k, v] : o.engine) {
        config[k] = value_json(v);
    }
    return config;
}

// "metric \"anls\" there, \"chars\" here" for each key a results directory's config.json and this run disagree on.
std::string config_differences(const json & there, const json & here) {
    std::string out;
    json        keys = here;
    keys.update(there);  // every key of either
    for (const auto & [k, v] : keys.items()) {
        const json a = there.contains(k) ? there.at(k) : json(), b = here.contains(k) ? here.at(k) : json();
        if (a != b) {
            out += (out.empty() ? "" : ", ") + k + " " + a.dump() + " there, " + b.dump() + " here";
        }
    }
    return out;
}

void check_config(const std::string & path, const json & config) {
    if (!fs::exists(path)) {
        write_file_atomic(path, config.dump(2) + "\n");
        return;
    }
    std::ifstream in(path);
    json          there;
    try {
        there = json::parse(in);
    } catch (const json::exception & e) {
        throw error(path + ": not a results config (" + e.what() + ")");
    }
    if (there != config) {
        throw error(path + " describes another run (" + config_differences(there, config) + ")");
    }
}

// Reads the results already written (resume). A last line left unterminated or half-written by a killed run or a
// full disk is cut, so that appending continues after the last complete record; a bad line before other records
// means the file is not ours to append to.
std::set<std::string> load_done(const std::string & path) {
    std::set<std::string> done;
    std::ifstream         in(path, std::ios::binary);
    const std::string     text{ std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>() };
    size_t                good_end = 0, line_no = 0;
    for (size_t at = 0; at < text.size(); ++line_no) {
        const size_t      nl   = text.find('\n', at);
        const std::string line = text.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
        const bool        rest = nl != std::string::npos && text.find_first_not_of(" \t\r\n", nl) != std::string::npos;
        try {
            if (nl == std::string::npos) {
                throw error("unterminated");
            }
            if (line.find_first_not_of(" \t\r") != std::string::npos) {
                const json j = json::parse(line);
                done.insert(key(j.at("id"), j.at("method"), j.at("budget")));
            }
            good_end = nl + 1;
            at       = nl + 1;
        } catch (const std::exception & e) {
            if (rest) {
                throw error(path + ":" + std::to_string(line_no + 1) + ": not a results record (" + e.what() + ")");
            }
            break;
        }
    }
    in.close();
    if (good_end < text.size()) {
        fs::resize_file(path, uintmax_t(good_end));
    }
    return done;
}

// Canonical names ("snapkv+mixkv" and "mixkv" merge), each (method, budget) validated before any work.
std::vector<std::string> canonical_methods(const eval_options & o, method_requirements & needs) {
    std::vector<std::string> out;
    for (const std::string & m : o.methods) {
        compression c = compression_named(m, o.settings);
        for (int32_t b : c.enabled ? o.budgets : std::vector<int32_t>{}) {
            set_option(c, "budget", int64_t(b));
            c.validate();
            needs |= requirements(c.spec, c.params);
        }
        out.push_back(c.name());
    }
    // "mixkv,snapkv+mixkv" names one method: run it once.
    std::vector<std::string> unique;
    for (const std::string & m : out) {
        if (std::find(unique.begin(), unique.end(), m) == unique.end()) {
            unique.push_back(m);
        }
    }
    return unique;
}

// An item the engine could not process: recorded, so that the report counts it and a resume does not retry it.
json failed_record(const eval_item & item, const std::string & method, int32_t budget, const std::string & why) {
    return { { "id", item.id },     { "method", method },  { "budget", budget }, { "type", item.type },
             { "answers", item.answers }, { "error", why }, { "prediction", nullptr }, { "score", nullptr } };
}

// Appends one record as one line, or nothing: a failed write is cut back off before the error.
// Every record names its run: the hash of config.json.
void append(std::ofstream & out, const eval_plan & plan, json rec) {
    const std::string & path = plan.results_path;
    rec["config"]            = plan.config_id;
    const auto before        = out.tellp();
    // Invalid UTF-8 (an answer cut inside a character) becomes U+FFFD instead of an exception.
    out << rec.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    out.flush();  // a killed run loses nothing that was answered
    if (!out) {
        const std::string why = std::strerror(errno);
        out.close();
        std::error_code ec;
        fs::resize_file(path, uintmax_t(before), ec);
        throw error(path + ": cannot write a result (" + why + ")");  // ends the run, whatever --strict says
    }
}

// A (method, budget) that failed for a unit of work (one item, or a conversation's turns): a record for each of its
// items not answered yet, or the error itself under --strict, naming the unit (`what`).
void record_failure(const eval_plan & plan, std::ofstream & out, std::span<const eval_item> items, const std::string & what,
                    const std::string & method, int32_t budget, const error & e) {
    if (plan.options.strict) {
        throw error(what + ": " + e.what());
    }
    for (const eval_item & item : items) {
        if (!plan.done.count(key(item.id, method, budget))) {
            append(out, plan, failed_record(item, method, budget, e.what()));
        }
    }
}

json record(const eval_item & item, const std::string & method, int32_t budget, const eval_prefill & pf,
            const eval_answer & a, const metric_info & metric) {
    json rec = { { "id", item.id },           { "method", method },
                 { "budget", budget },        { "type", item.type },
                 { "answers", item.answers }, { "prompt_tokens", pf.prompt_tokens },
                 { "image_tokens", pf.image_tokens }, { "kv_bytes_full", pf.kv_bytes_full },
                 { "prefill_s", pf.prefill_s },       { "kv_bytes_compressed", a.kv_bytes },
                 { "compress_s", a.compress_s },      { "decode_s", a.decode_s },
                 { "output_tokens", a.n_tokens },
                 { "prediction", answer_text(a.output, metric.whole_output) } };
    if (!is_full_cache(method)) {
        rec["agreement"]      = a.agreement ? json(*a.agreement) : json(nullptr);
        rec["mean_kl"]        = a.mean_kl ? json(*a.mean_kl) : json(nullptr);
        rec["attn_rel_error"] = a.attn_rel_error.empty() ? json(nullptr) : json(a.attn_rel_error);
    }
    // The item's own score; a corpus-only metric (CIDEr's document frequencies) has one only in the report.
    if (metric.corpus_only) {
        rec["score"] = nullptr;
    } else {
        const metric_item mi{ rec["prediction"], item.answers, item.type };
        rec["score"] = evaluate(metric.name, std::span(&mi, 1)).score;
    }
    return rec;
}

// The (method, budget) pairs that still miss a record for one of `items` (a resumed run skips the others).
std::vector<std::pair<std::string, int32_t>> pending(const eval_plan & plan, std::span<const eval_item> items) {
    std::vector<std::pair<std::string, int32_t>> todo;
    for (const std::string & m : plan.options.methods) {
        for (int32_t b : is_full_cache(m) ? std::vector<int32_t>{ 0 } : plan.options.budgets) {
            if (std::any_of(items.begin(), items.end(), [&](const eval_item & t) { return !plan.done.count(key(t.id, m, b)); })) {
                todo.emplace_back(m, b);
            }
        }
    }
    return todo;
}

// The run's compression for one (method, budget).
compression compression_at(const eval_options & o, const std::string & method, int32_t budget) {
    compression c   = compression_named(method, o.settings);
    c.params.budget = budget;
    return c;
}

// --turns: the sizes of the runs of consecutive items about the same context (images and text).
std::vector<size_t> conversation_sizes(const std::vector<eval_item> & items) {
    std::vector<size_t> sizes;
    for (size_t i = 0; i < items.size(); ++i) {
        const bool same = i > 0 && items[i].images == items[i - 1].images && items[i].context == items[i - 1].context;
        if (same) {
            ++sizes.back();
        } else {
            sizes.push_back(1);
        }
    }
    return sizes;
}

// --turns: every conversation of the plan asked with the full cache, then with each (method, budget) that has a turn
// left; each turn's record adds its number, the longest head's entries after it, and whether its answer is the full
// cache conversation's.
void run_conversations(const eval_plan & plan, eval_engine & engine, std::ofstream & out,
                       const eval_progress & progress) {
    const eval_options & o     = plan.options;
    size_t               first = 0;
    for (const size_t n : plan.conversations) {
        if (progress) {
            progress(first, plan.items.size());
        }
        const std::vector<eval_item> turns(plan.items.begin() + ptrdiff_t(first), plan.items.begin() + ptrdiff_t(first + n));
        first += n;
        const auto todo = pending(plan, turns);
        if (todo.empty()) {
            continue;
        }
        auto fail = [&](const std::string & method, int32_t budget, const error & e) {
            record_failure(plan, out, turns, "conversation of item '" + turns[0].id + "'", method, budget, e);
        };
        std::vector<eval_turn> full;
        try {
            full = engine.converse(turns, nullptr, o.n_predict);
        } catch (const error & e) {
            for (const auto & [method, budget] : todo) {
                fail(method, budget, e);
            }
            continue;
        }
        for (const auto & [method, budget] : todo) {
            const compression      c = compression_at(o, method, budget);
            std::vector<eval_turn> got;
            try {
                got = c.enabled ? engine.converse(turns, &c, o.n_predict) : full;
            } catch (const error & e) {
                fail(method, budget, e);
                continue;
            }
            for (size_t i = 0; i < turns.size(); ++i) {
                if (plan.done.count(key(turns[i].id, method, budget))) {
                    continue;
                }
                json rec            = record(turns[i], method, budget, got[i].prefill, got[i].answer, *plan.metric);
                rec["turn"]         = i + 1;
                rec["entries_held"] = got[i].answer.entries_held;
                rec["same_as_full"] = rec["prediction"] == answer_text(full[i].answer.output, plan.metric->whole_output);
                append(out, plan, rec);
            }
        }
    }
}

}  // namespace

std::vector<eval_turn> eval_engine::converse(const std::vector<eval_item> &, const compression *, int32_t) {
    throw error("this engine has no multi-turn protocol (--turns)");
}

std::string answer_text(const std::string & output, bool whole_output) {
    const std::string s = whole_output ? output : output.substr(0, output.find('\n'));
    const size_t      b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

eval_plan plan_eval(const eval_options & options) {
    eval_plan plan;
    plan.options               = options;
    const dataset_info & data  = find_dataset(options.dataset);
    plan.metric                = &find_metric(options.metric.empty() ? data.metric : options.metric);
    if (options.methods.empty()) {
        throw error("--methods names no method (a comma-separated list: full, snapkv+ecokv, ...)");
    }
    if (options.budgets.empty()) {
        throw error("--budgets names no budget (a comma-separated list: 64,128)");
    }
    plan.options.methods       = canonical_methods(options, plan.needs);
    std::sort(plan.options.budgets.begin(), plan.options.budgets.end());
    plan.options.budgets.erase(std::unique(plan.options.budgets.begin(), plan.options.budgets.end()),
                               plan.options.budgets.end());
    if (options.n_shards < 1 || options.shard < 0 || options.shard >= options.n_shards) {
        throw error("--shard must be i/n with 0 <= i < n");
    }
    if (options.n_predict < 1 || options.n_predict > 1000000) {
        throw error("-n " + std::to_string(options.n_predict) + " must lie in [1, 1000000]");
    }

    if (options.turns && options.mode != eval_mode::agnostic) {
        throw error("--turns asks each question after the context is compressed: it takes --mode agnostic");
    }
    if (options.settings.recompress_slack >= 0 && !options.turns) {
        throw error("--recompress-slack compresses a conversation again between its turns: it needs --turns");
    }
    if (options.settings.decode_compress > 0 && options.turns) {
        throw error("--decode-compress and --turns together are not supported yet");
    }

    std::vector<eval_item> items = load_dataset(data.name, options.data_dir);
    if (options.limit > 0 && size_t(options.limit) < items.size()) {
        items.resize(size_t(options.limit));
    }
    for (const eval_item & it : items) {
        if (plan.metric->needs_type && it.type.empty()) {  // else evaluate() would throw after the first answer
            throw error("metric " + plan.metric->name + " needs each item's question type; " + data.name + " item '" +
                        it.id + "' has none");
        }
    }
    // Shards take whole conversations (--turns; else every item is one).
    const std::vector<size_t> sizes = options.turns ? conversation_sizes(items) : std::vector<size_t>(items.size(), 1);
    size_t                    at    = 0;
    for (size_t k = 0; k < sizes.size(); at += sizes[k++]) {
        if (int32_t(k % size_t(options.n_shards)) == options.shard) {
            plan.items.insert(plan.items.end(), std::make_move_iterator(items.begin() + ptrdiff_t(at)),
                              std::make_move_iterator(items.begin() + ptrdiff_t(at + sizes[k])));
            plan.conversations.push_back(sizes[k]);
        }
    }

    fs::create_directories(options.out_dir);
    plan.lock         = lock_dir(options.out_dir);
    const json config = config_of(options, *plan.metric);
    check_config(options.out_dir + "/config.json", config);
    const std::string text = config.dump();
    plan.config_id          = hex(hash_bytes(text.data(), text.size(), 0));
    plan.results_path = options.out_dir + "/results" +
                        (options.n_shards > 1 ? ".shard-" + std::to_string(options.shard) + "-of-" +
                                                    std::to_string(options.n_shards)
                                              : "") +
                        ".jsonl";
    plan.done = load_done(plan.results_path);
    return plan;
}

void run_eval(const eval_plan & plan, eval_engine & engine, const eval_progress & progress) {
    const eval_options & o = plan.options;
    std::ofstream        out(plan.results_path, std::ios::app | std::ios::binary);
    if (!out) {
        throw error(plan.results_path + ": cannot open for writing (" + std::strerror(errno) + ")");
    }
    if (o.turns) {
        run_conversations(plan, engine, out, progress);
    }
    for (size_t k = 0; k < plan.items.size() && !o.turns; ++k) {
        if (progress) {
            progress(k, plan.items.size());
        }
        const eval_item & item = plan.items[k];
        const auto        todo = pending(plan, std::span(&item, 1));
        if (todo.empty()) {
            continue;
        }
        // A failed prefill fails the whole item; a failed answer only its (method, budget).
        auto fail = [&](const std::string & method, int32_t budget, const error & e) {
            record_failure(plan, out, std::span(&item, 1), "item '" + item.id + "'", method, budget, e);
        };
        eval_prefill pf;
        try {
            pf = engine.prefill(item, o.mode, o.n_predict, plan.needs);
        } catch (const error & e) {
            for (const auto & [method, budget] : todo) {
                fail(method, budget, e);
            }
            continue;
        }
        for (const auto & [method, budget] : todo) {
            const compression c = compression_at(o, method, budget);
            json              rec;
            try {
                const eval_answer a = c.enabled ? engine.answer_compressed(c) : engine.answer_full();
                rec = record(item, method, budget, pf, a, *plan.metric);
            } catch (const error & e) {
                fail(method, budget, e);
                continue;
            }
            append(out, plan, rec);
        }
    }
    if (progress) {
        progress(plan.items.size(), plan.items.size());
    }
}

}  // namespace ecokv
