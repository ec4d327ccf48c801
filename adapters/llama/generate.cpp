#include "ecokv/llama-generate.h"

#include <mtmd.h>

#include "ecokv/error.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

namespace ecokv::llama {

std::vector<llama_token> tokenize(const llama_model * model, const std::string & text, bool add_special) {
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t       n     = -llama_tokenize(vocab, text.data(), int32_t(text.size()), nullptr, 0, add_special, true);
    std::vector<llama_token> out(size_t(std::max(n, 0)));
    if (llama_tokenize(vocab, text.data(), int32_t(text.size()), out.data(), int32_t(out.size()), add_special, true) < 0) {
        throw error("cannot tokenize the prompt");
    }
    return out;
}

std::string detokenize(const llama_model * model, const std::vector<llama_token> & tokens) {
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::string         out;
    char                buf[256];
    for (llama_token t : tokens) {
        const int32_t n = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, false);
        if (n > 0) {
            out.append(buf, size_t(n));
        }
    }
    return out;
}

namespace {

// The plain format (llama-generate.h): leading media markers keep their lines, then "\n" and the text.
std::string plain_chat_text(const llama_model * model, const std::vector<chat_message> & messages) {
    const std::string marker = mtmd_default_marker();
    const char *      eos    = llama_vocab_get_text(llama_model_get_vocab(model), llama_vocab_eos(llama_model_get_vocab(model)));
    std::string       out;
    for (const chat_message & m : messages) {
        if (m.role == "assistant") {
            out += m.content + (eos ? eos : "");
            continue;
        }
        if (m.role == "system") {
            out += m.content + "\n";
            continue;
        }
        size_t at = 0;
        while (m.content.compare(at, marker.size(), marker) == 0) {
            at += marker.size();
            at += at < m.content.size() && m.content[at] == '\n';
        }
        out += m.content.substr(0, at) + "\n" + m.content.substr(at);
    }
    return out;
}

}  // namespace

std::string chat_text(const llama_model * model, const std::vector<chat_message> & messages) {
    const char * tmpl = llama_model_chat_template(model, nullptr);
    if (tmpl == nullptr) {
        return plain_chat_text(model, messages);
    }
    std::vector<llama_chat_message> msgs;
    size_t                          size = 512;
    for (const chat_message & m : messages) {
        msgs.push_back({ m.role.c_str(), m.content.c_str() });
        size += 2 * m.content.size() + 64;
    }
    std::vector<char> buf(size);
    int32_t n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), true, buf.data(), int32_t(buf.size()));
    if (n > int32_t(buf.size())) {
        buf.resize(size_t(n));
        n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), true, buf.data(), int32_t(buf.size()));
    }
    if (n < 0) {
        throw error("the model's chat template is not one llama.cpp knows");
    }
    return std::string(buf.data(), size_t(n));
}

std::string chat_prompt(const llama_model * model, const std::string & user) {
    const char * tmpl = llama_model_chat_template(model, nullptr);
    if (tmpl == nullptr) {
        return user;
    }
    const llama_chat_message msg{ "user", user.c_str() };
    std::vector<char>        buf(user.size() * 2 + 512);
    int32_t                  n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), int32_t(buf.size()));
    if (n > int32_t(buf.size())) {
        buf.resize(size_t(n));
        n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), int32_t(buf.size()));
    }
    return n < 0 ? user : std::string(buf.data(), size_t(n));  // unknown template: plain text
}

std::vector<float> decode(llama_context * ctx, const std::vector<llama_token> & tokens, llama_pos pos0) {
    if (tokens.empty()) {
        throw error("nothing to decode (empty text)");
    }
    const int32_t n_batch = int32_t(llama_n_batch(ctx));
    llama_batch   batch   = llama_batch_init(n_batch, 0, 1);
    for (size_t first = 0; first < tokens.size(); first += size_t(n_batch)) {
        const size_t n = std::min(tokens.size() - first, size_t(n_batch));
        batch.n_tokens = int32_t(n);
        for (size_t i = 0; i < n; ++i) {
            batch.token[i]     = tokens[first + i];
            batch.pos[i]       = pos0 + llama_pos(first + i);
            batch.n_seq_id[i]  = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i]    = first + i + 1 == tokens.size();
        }
        if (llama_decode(ctx, batch) != 0) {
            llama_batch_free(batch);
            throw error("llama_decode failed at position " + std::to_string(pos0 + first) +
                        " (context too small for the prompt?)");
        }
    }
    llama_batch_free(batch);
    return last_logits(ctx);
}

std::vector<float> last_logits(llama_context * ctx) {
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    const float * logits  = llama_get_logits_ith(ctx, -1);
    if (logits == nullptr) {
        throw error("llama.cpp computed no logits for the last position (a prompt must end with text)");
    }
    return std::vector<float>(logits, logits + n_vocab);
}

llama_token argmax(const std::vector<float> & logits) {
    return llama_token(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

llama_token pick_token(const std::vector<float> & logits, double temperature, std::mt19937_64 & rng) {
    if (temperature <= 0) {
        return argmax(logits);
    }
    const float         top = *std::max_element(logits.begin(), logits.end());
    std::vector<double> w(logits.size());
    for (size_t i = 0; i < w.size(); ++i) {
        w[i] = std::exp((double(logits[i]) - top) / temperature);
    }
    return llama_token(std::discrete_distribution<size_t>(w.begin(), w.end())(rng));
}

generation greedy(llama_context * ctx, std::vector<float> first_logits, llama_pos pos, int32_t n, bool keep_logits,
                  const step_hook & after_step) {
    llama_pos next = pos;
    return greedy(llama_model_get_vocab(llama_get_model(ctx)), std::move(first_logits), n, keep_logits,
                  [&](llama_token t) {
                      std::vector<float> logits = decode(ctx, { t }, next++);
                      if (after_step) {
                          after_step();
                      }
                      return logits;
                  });
}

generation greedy(const llama_vocab * vocab, std::vector<float> first_logits, int32_t n, bool keep_logits,
                  const std::function<std::vector<float>(llama_token)> & decode_one) {
    generation          out;
    std::vector<float>  logits = std::move(first_logits);
    const auto          t0     = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < n; ++i) {
        const llama_token t = argmax(logits);
        out.tokens.push_back(t);
        if (keep_logits) {
            out.logits.push_back(logits);
        }
        if (llama_vocab_is_eog(vocab, t) || i + 1 == n) {
            break;
        }
        logits = decode_one(t);
    }
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

std::vector<std::vector<float>> force(llama_context * ctx, const std::vector<llama_token> & tokens, llama_pos pos,
                                      const step_hook & after_step) {
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        out.push_back(decode(ctx, { tokens[i] }, pos + llama_pos(i)));
        if (after_step) {
            after_step();
        }
    }
    return out;
}

fidelity compare_to_full(llama_context * compressed, const generation & full, llama_pos pos,
                         const std::vector<float> * first, const step_hook & after_step) {
    if (full.tokens.empty() || full.logits.size() != full.tokens.size()) {
        throw error("the reference answer has no tokens or was generated without its logits (keep_logits)");
    }
    fidelity                        f;
    std::vector<std::vector<float>> q  = force(compressed, full.tokens, pos, after_step);
    size_t                          i0 = 1;  // index in full.tokens of the token q[0] predicts
    if (first != nullptr) {
        q.insert(q.begin(), *first);
        i0 = 0;
    }
    for (size_t i = 0; i < q.size(); ++i) {
        f.agreement += argmax(q[i]) == full.tokens[i + i0];
        f.mean_kl += kl_divergence(full.logits[i + i0], q[i]);
        ++f.n;
    }
    if (f.n > 0) {
        f.agreement /= f.n;
        f.mean_kl /= f.n;
    }
    return f;
}

double kl_divergence(const std::vector<float> & p_logits, const std::vector<float> & q_logits) {
    auto log_softmax = [](const std::vector<float> & x) {
        const double        mx = *std::max_element(x.begin(), x.end());
        double              s  = 0;
        for (float v : x) {
            s += std::exp(double(v) - mx);
        }
        std::vector<double> out(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
            out[i] = double(x[i]) - mx - std::log(s);
        }
        return out;
    };
    const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
    double                    kl = 0;
    for (size_t i = 0; i < lp.size(); ++i) {
        kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    }
    return std::max(kl, 0.0);
}

}  // namespace ecokv::llama
