// The benchmark metrics (eval/metrics): each official evaluator's documented behaviour on cases worked out by
// hand, the golden cases of tests/data/metrics/reference.py (a plain-Python restatement of the official scripts,
// run with Python's own float/re/str), the JSON Lines reader's errors, and `ecokv metric` end to end.
#include "ecokv/error.h"
#include "ecokv/metrics.h"

#include "test-util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>

namespace {

using namespace ecokv::test;
using json   = nlohmann::json;
using ecokv::metric_item;
using strings = std::vector<std::string>;

const std::string k_data = std::string(ECOKV_TEST_DATA) + "/metrics";
const std::string k_hme  = "Handwritten Mathematical Expression Recognition";


// ---------------------------------------------------------------------------------------------------------------
// registry

TEST(metric_registry, lists_every_metric_in_order) {
    strings names;
    for (const auto & m : ecokv::list_metrics()) {
        names.push_back(m.name);
        EXPECT_FALSE(m.description.empty()) << m.name;
        EXPECT_EQ(m.needs_type, m.name == "ocrbench") << m.name;
    }
    EXPECT_EQ(names, (strings{ "exact", "relaxed", "vqa", "anls", "chars", "cider", "rougel", "ocrbench" }));
}

// The rows the evaluation runner reads instead of metric names: chars scores the whole output (transcriptions
// span lines), cider has no per-item score (its idf comes from the whole corpus).
TEST(metric_registry, whole_output_and_corpus_only_rows) {
    strings whole, corpus;
    for (const auto & m : ecokv::list_metrics()) {
        if (m.whole_output) {
            whole.push_back(m.name);
        }
        if (m.corpus_only) {
            corpus.push_back(m.name);
        }
    }
    EXPECT_EQ(whole, (strings{ "chars" }));
    EXPECT_EQ(corpus, (strings{ "cider" }));
    EXPECT_TRUE(ecokv::find_metric("chars").whole_output);
    EXPECT_FALSE(ecokv::find_metric("chars").corpus_only);
    EXPECT_TRUE(ecokv::find_metric("cider").corpus_only);
    EXPECT_FALSE(ecokv::find_metric("cider").whole_output);
    EXPECT_FALSE(ecokv::find_metric("exact").whole_output);
    EXPECT_FALSE(ecokv::find_metric("exact").corpus_only);
}

TEST(metric_registry, unknown_names_list_the_known_ones) {
    const std::string want = "unknown metric 'bleu'; known: exact, relaxed, vqa, anls, chars, cider, rougel, ocrbench";
    EXPECT_EQ(error_of([] { ecokv::find_metric("bleu"); }), want);
    const std::vector<metric_item> items = { { "a", { "a" }, "" } };
    EXPECT_EQ(error_of([&] { ecokv::evaluate("bleu", items); }), want);
}

TEST(metric_registry, evaluate_checks_its_items) {
    EXPECT_EQ(error_of([] { ecokv::evaluate("exact", {}); }), "metric exact: no items to score");
    const std::vector<metric_item> no_answers = { { "a", { "a" }, "" }, { "b", {}, "" } };
    EXPECT_EQ(error_of([&] { ecokv::evaluate("anls", no_answers); }), "metric anls: item 2 has no answers");
    const std::vector<metric_item> no_type = { { "a", { "a" }, "" } };
    EXPECT_EQ(error_of([&] { ecokv::evaluate("ocrbench", no_type); }),
              "metric ocrbench: item 1 has no type (the question category)");
}

// Every metric scores a perfect prediction above zero and a wrong one at zero (two images: one gives CIDEr 0,
// see cider.one_image_is_zero; four answers: one gives VQA accuracy 0, see vqa.accuracy_over_leave_one_out),
// chars excepted: it gives partial credit, here "zebra" 14 edits from the 15 characters of "a red stop sign".
TEST(metric_registry, every_metric_runs) {
    const auto item = [](const char * pred, const char * answer) {
        return metric_item{ pred, strings(4, answer), "Regular Text Recognition" };
    };
    const std::vector<metric_item> right = { item("a red stop sign", "a red stop sign"), item("two dogs", "two dogs") };
    const std::vector<metric_item> wrong = { item("zebra", "a red stop sign"), item("cat", "two dogs") };
    for (const auto & m : ecokv::list_metrics()) {
        const ecokv::metric_result r = ecokv::evaluate(m.name, right);
        EXPECT_EQ(r.metric, m.name);
        EXPECT_EQ(r.n, 2u);
        EXPECT_GT(r.score, 0.0) << m.name;
        EXPECT_DOUBLE_EQ(ecokv::evaluate(m.name, wrong).score, m.name == "chars" ? (1.0 - 14.0 / 15.0) / 2 : 0.0)
            << m.name;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// exact

TEST(exact, strips_and_lower_cases_then_takes_the_max) {
    using ecokv::metrics::exact_match;
    EXPECT_EQ(exact_match("  Paris\n", strings{ "paris" }), 1.0);
    EXPECT_EQ(exact_match("PARIS", strings{ "Lyon", "paris " }), 1.0);
    EXPECT_EQ(exact_match("Paris.", strings{ "paris" }), 0.0);  // no punctuation handling
    EXPECT_EQ(exact_match("ÉCOLE", strings{ "école" }), 1.0);   // Python's lower() is Unicode
    const std::vector<metric_item> items = { { "a", { "a" }, "" }, { "b", { "c" }, "" }, { "C", { "c" }, "" } };
    EXPECT_DOUBLE_EQ(ecokv::evaluate("exact", items).score, 2.0 / 3.0);
}

// ---------------------------------------------------------------------------------------------------------------
// relaxed (ChartQA)

TEST(relaxed, python_float_reads_what_python_reads) {
    using ecokv::metrics::python_float;
    EXPECT_EQ(python_float(" 7 "), 7.0);
    EXPECT_EQ(python_float("1_000"), 1000.0);
    EXPECT_EQ(python_float("+.5e-1"), 0.05);
    EXPECT_EQ(python_float("5."), 5.0);
    EXPECT_EQ(python_float("1E+2"), 100.0);
    EXPECT_EQ(python_float("-Infinity"), -std::numeric_limits<double>::infinity());
    EXPECT_EQ(python_float("1e400"), std::numeric_limits<double>::infinity());  // overflow: inf, no error
    EXPECT_EQ(python_float("-1e-400"), 0.0);                                    // underflow: -0.0
    EXPECT_TRUE(std::isnan(*python_float("nan")));
    EXPECT_EQ(python_float("\u0663"), 3.0);  // ARABIC-INDIC DIGIT THREE
    for (const char * bad : { "", ".", "1__000", "_1", "1_", "1e", "1,000", "12%", "0x10", "1 2", "abc", "in f" }) {
        EXPECT_FALSE(python_float(bad).has_value()) << bad;
    }
}

TEST(relaxed, five_percent_of_the_target) {
    using ecokv::metrics::relaxed_correctness;
    EXPECT_TRUE(relaxed_correctness("105", "100"));    // |105 - 100| / 100 = 0.05 <= 0.05
    EXPECT_TRUE(relaxed_correctness("95", "100"));     // 0.05
    EXPECT_FALSE(relaxed_correctness("106", "100"));   // 0.06
    EXPECT_FALSE(relaxed_correctness("94.9", "100"));  // 0.051
    EXPECT_TRUE(relaxed_correctness("-10.4", "-10"));  // 0.4 / |-10| = 0.04
}

TEST(relaxed, percent_signs_divide_by_100) {
    using ecokv::metrics::relaxed_correctness;
    EXPECT_TRUE(relaxed_correctness("50%", "0.5"));   // 0.5 vs 0.5
    EXPECT_TRUE(relaxed_correctness("52%", "50%"));   // 0.52 vs 0.5: 0.04
    EXPECT_FALSE(relaxed_correctness("12%", "12"));   // 0.12 vs 12
    EXPECT_TRUE(relaxed_correctness("5%%", "0.05"));  // rstrip('%') takes every trailing '%'
}

TEST(relaxed, strings_and_zero_targets_compare_as_text) {
    using ecokv::metrics::relaxed_correctness;
    EXPECT_TRUE(relaxed_correctness("Yes", "yes"));    // case-insensitive
    EXPECT_TRUE(relaxed_correctness(" 7 ", "7"));      // the prediction is stripped (Qwen-VL's caller)...
    EXPECT_FALSE(relaxed_correctness("yes", " yes"));  // ...the target is not
    EXPECT_FALSE(relaxed_correctness("0.0", "0"));     // a zero target is falsy: "0.0" != "0" as text
    EXPECT_TRUE(relaxed_correctness("0", "0"));
    EXPECT_FALSE(relaxed_correctness("nan", "nan"));     // NaN is truthy, and nan <= 0.05 is false
    EXPECT_FALSE(relaxed_correctness("1,000", "1000"));  // float("1,000") raises: text comparison
    EXPECT_EQ(ecokv::metrics::relaxed_accuracy("41", strings{ "abc", "40" }), 1.0);  // 1/40 = 0.025
}

// ---------------------------------------------------------------------------------------------------------------
// vqa (TextVQA / VQAv2)

TEST(vqa, normalisation_of_the_evalai_processor) {
    using ecokv::metrics::vqa_normalize;
    EXPECT_EQ(vqa_normalize("Two dogs."), "2 dogs");  // lower, period stripped, number word
    EXPECT_EQ(vqa_normalize("The cat"), "cat");       // article
    EXPECT_EQ(vqa_normalize("None"), "0");
    EXPECT_EQ(vqa_normalize("dont"), "don't");  // contractions table
    EXPECT_EQ(vqa_normalize("whats"), "what's");
    EXPECT_EQ(vqa_normalize("it's"), "it 's");           // "'s" is split off before anything else...
    EXPECT_EQ(vqa_normalize("what's"), "what 's");       // ...so "what's" and "whats" differ, as in EvalAI
    EXPECT_EQ(vqa_normalize("1,000"), "1000");           // commas are deleted: digit,digit keeps the number
    EXPECT_EQ(vqa_normalize("a,b"), "ab");               // and words merge (vqaEval.py alone would give "a b")
    EXPECT_EQ(vqa_normalize("x-y"), "x y");              // punctuation inside a word becomes a space...
    EXPECT_EQ(vqa_normalize("x - y"), "x y");            // ...and is deleted when next to a space
    EXPECT_EQ(vqa_normalize("red (dark)"), "red dark");  // " (" deletes '(', ')' becomes a space
    EXPECT_EQ(vqa_normalize("3.5"), "3.5");              // a period before a digit stays
    EXPECT_EQ(vqa_normalize("a.b"), "ab");               // any other period goes
    EXPECT_EQ(vqa_normalize("1.2.3."), "1.2.3");
    EXPECT_EQ(vqa_normalize("What is it? It's a dog!"), "what is it it 's dog");
}

TEST(vqa, period_strip_stops_after_32) {
    // vqaEval.py passes re.UNICODE (32) where re.sub() takes `count`: only the first 32 periods go.
    const std::string dots(40, '.');
    EXPECT_EQ(ecokv::metrics::vqa_normalize("a" + dots + "b"), "a" + std::string(8, '.') + "b");
}

TEST(vqa, accuracy_over_leave_one_out_subsets) {
    using ecokv::metrics::vqa_accuracy;
    const auto answers = [](int n_match) {
        strings a;
        for (int i = 0; i < 10; ++i) {
            a.push_back(i < n_match ? (i % 2 ? "two dogs" : "2 dogs") : "cat " + std::to_string(i));
        }
        return a;
    };
    // k of the 10 humans gave "2 dogs" (after normalisation). Leaving out a matching answer leaves k - 1
    // matches, leaving out another leaves k; each subset scores min(1, matches / 3):
    EXPECT_DOUBLE_EQ(vqa_accuracy("Two dogs.", answers(0)), 0.0);
    EXPECT_DOUBLE_EQ(vqa_accuracy("Two dogs.", answers(1)), 0.3);  // (1 * 0 + 9 * 1/3) / 10
    EXPECT_DOUBLE_EQ(vqa_accuracy("Two dogs.", answers(2)), 0.6);  // (2 * 1/3 + 8 * 2/3) / 10
    EXPECT_DOUBLE_EQ(vqa_accuracy("Two dogs.", answers(3)), 0.9);  // (3 * 2/3 + 7 * 1) / 10
    EXPECT_DOUBLE_EQ(vqa_accuracy("Two dogs.", answers(4)), 1.0);  // (4 * 1 + 6 * 1) / 10
    // Fewer than 10 answers: the same formula over what is there.
    EXPECT_DOUBLE_EQ(vqa_accuracy("yes", strings{ "yes", "yes", "yes" }), 2.0 / 3.0);  // each subset: 2 matches
    EXPECT_DOUBLE_EQ(vqa_accuracy("yes", strings{ "yes" }), 0.0);                      // the only subset is empty
}

// ---------------------------------------------------------------------------------------------------------------
// anls (DocVQA)

TEST(anls, similarity_by_hand) {
    using ecokv::metrics::anls;
    EXPECT_DOUBLE_EQ(anls("Paris", strings{ "Paris" }), 1.0);
    EXPECT_DOUBLE_EQ(anls("Hello  World", strings{ "hello world" }), 1.0);  // lower-cased, spaces collapsed
    EXPECT_DOUBLE_EQ(anls("abcdefghiX", strings{ "abcdefghij" }), 0.9);     // 1 edit / 10
    EXPECT_DOUBLE_EQ(anls("abcdeXXXXX", strings{ "abcdefghij" }), 0.5);     // NL = 5/10: kept (script: < 0.5 -> 0)
    EXPECT_DOUBLE_EQ(anls("abcdeXXXXXX", strings{ "abcdefghij" }), 0.0);    // NL = 6/11 > 0.5
    EXPECT_DOUBLE_EQ(anls("London", strings{ "Paris", "london" }), 1.0);    // max over answers
    EXPECT_DOUBLE_EQ(anls("", strings{ "" }), 1.0);                         // both empty: NL = 0
    // The length is that of the raw strings: " paris " (7) vs "Pariss" (6), distance 1 -> 1 - 1/7.
    EXPECT_DOUBLE_EQ(anls(" paris ", strings{ "Pariss" }), 1.0 - 1.0 / 7.0);
    // Characters, not bytes: "École" vs "Ecole" is one substitution in 5.
    EXPECT_DOUBLE_EQ(anls("École", strings{ "Ecole" }), 0.8);
    const std::vector<metric_item> items = { { "abcdefghiX", { "abcdefghij" }, "" }, { "x", { "y" }, "" } };
    EXPECT_DOUBLE_EQ(ecokv::evaluate("anls", items).score, 0.45);  // (0.9 + 0) / 2
}

// ---------------------------------------------------------------------------------------------------------------
// chars (transcriptions)

TEST(chars, character_accuracy_by_hand) {
    using ecokv::metrics::char_accuracy;
    EXPECT_DOUBLE_EQ(char_accuracy("TOTAL 12.50", strings{ "TOTAL 12.50" }), 1.0);
    EXPECT_DOUBLE_EQ(char_accuracy("TOTAL 12.5", strings{ "TOTAL 12.50" }), 1.0 - 1.0 / 11.0);  // 1 deletion / 11
    EXPECT_DOUBLE_EQ(char_accuracy("TOTAL 12.50", strings{ "TOTAL 12.5" }), 0.9);               // over the answer's 10
    EXPECT_DOUBLE_EQ(char_accuracy(" \tTOTAL 12.50\n", strings{ "TOTAL 12.50" }), 1.0);        // prediction stripped
    EXPECT_DOUBLE_EQ(char_accuracy("Total", strings{ "TOTAL" }), 1.0 - 4.0 / 5.0);             // case-sensitive
    EXPECT_DOUBLE_EQ(char_accuracy("", strings{ "abc" }), 0.0);
    EXPECT_DOUBLE_EQ(char_accuracy("  ", strings{ "abc" }), 0.0);
    EXPECT_DOUBLE_EQ(char_accuracy("abcd", strings{ "abc" }), 1.0 - 1.0 / 3.0);
    EXPECT_DOUBLE_EQ(char_accuracy("abcdefgh", strings{ "abc" }), 0.0);  // 1 - 5/3 clipped
    EXPECT_DOUBLE_EQ(char_accuracy("", strings{ "" }), 1.0);             // max(1, 0): no division by 0
    EXPECT_DOUBLE_EQ(char_accuracy("x", strings{ "" }), 0.0);
    EXPECT_DOUBLE_EQ(char_accuracy("Paris", strings{ "London", "Pariss" }), 1.0 - 1.0 / 6.0);  // best answer
    // Characters, not bytes: one substitution in 5.
    EXPECT_DOUBLE_EQ(char_accuracy("École", strings{ "Ecole" }), 0.8);
}

TEST(chars, newlines_in_the_answer_are_characters) {
    using ecokv::metrics::char_accuracy;
    EXPECT_DOUBLE_EQ(char_accuracy("ab\ncd", strings{ "ab\ncd" }), 1.0);
    EXPECT_DOUBLE_EQ(char_accuracy("ab cd", strings{ "ab\ncd" }), 0.8);      // substitution
    EXPECT_DOUBLE_EQ(char_accuracy("abcd", strings{ "ab\ncd" }), 0.8);       // deletion
    EXPECT_DOUBLE_EQ(char_accuracy("ab\ncd\n", strings{ "ab\ncd" }), 1.0);  // the prediction's trailing one stripped
    // The answer is not stripped: its trailing newline is one more character to produce.
    EXPECT_DOUBLE_EQ(char_accuracy("abc\n", strings{ "abc\n" }), 0.75);
}

TEST(chars, corpus_score_is_the_mean) {
    const std::vector<metric_item> items = { { "TOTAL 12.5", { "TOTAL 12.50" }, "" }, { "", { "x" }, "" } };
    const ecokv::metric_result     r     = ecokv::evaluate("chars", items);
    EXPECT_EQ(r.metric, "chars");
    EXPECT_EQ(r.n, 2u);
    EXPECT_DOUBLE_EQ(r.score, (1.0 - 1.0 / 11.0) / 2);
}

// ---------------------------------------------------------------------------------------------------------------
// ocrbench

TEST(ocrbench, containment_per_category) {
    using ecokv::metrics::ocrbench_correct;
    EXPECT_TRUE(ocrbench_correct("The sign says STOP.", strings{ "stop" }, "Regular Text Recognition"));
    EXPECT_TRUE(ocrbench_correct("line one\nstop", strings{ "one stop" }, "Scene Text-centric VQA"));  // \n -> ' '
    EXPECT_FALSE(ocrbench_correct("sto p", strings{ "stop" }, "Regular Text Recognition"));
    EXPECT_TRUE(ocrbench_correct("anything", strings{ "" }, "Doc-oriented VQA"));  // "" in s is True
    // HME: spaces and newlines removed from both, case kept.
    EXPECT_TRUE(ocrbench_correct("x ^ { 2 }\n+ 1", strings{ "x^{2} +1" }, k_hme));
    EXPECT_FALSE(ocrbench_correct("X^{2}+1", strings{ "x^{2}+1" }, k_hme));
    EXPECT_TRUE(ocrbench_correct("X^{2}+1", strings{ "x^{2}+1" }, "Regular Text Recognition"));
    EXPECT_FALSE(ocrbench_correct("x^{2}\t+1", strings{ "x^{2}+1" }, k_hme));  // only ' ' and '\n' go
}

TEST(ocrbench, counts_by_type) {
    const std::vector<metric_item> items = {
        { "stop", { "stop" }, "Regular Text Recognition" },
        { "go", { "stop" }, "Regular Text Recognition" },
        { "x ^ 2", { "x^2" }, k_hme },
    };
    const ecokv::metric_result r = ecokv::evaluate("ocrbench", items);
    EXPECT_DOUBLE_EQ(r.score, 2.0 / 3.0);
    EXPECT_EQ(r.correct, 2u);
    ASSERT_EQ(r.by_type.size(), 2u);
    EXPECT_EQ(r.by_type.at("Regular Text Recognition").correct, 1u);
    EXPECT_EQ(r.by_type.at("Regular Text Recognition").n, 2u);
    EXPECT_DOUBLE_EQ(r.by_type.at("Regular Text Recognition").score, 0.5);
    EXPECT_EQ(r.by_type.at(k_hme).correct, 1u);
    EXPECT_EQ(ecokv::metric_result_json(r),
              "{\"metric\":\"ocrbench\",\"score\":0.6666666666666666,\"n\":3,\"correct\":2,\"by_type\":{"
              "\"Handwritten Mathematical Expression Recognition\":{\"score\":1.0,\"correct\":1,\"n\":1},"
              "\"Regular Text Recognition\":{\"score\":0.5,\"correct\":1,\"n\":2}}}");
}

// ---------------------------------------------------------------------------------------------------------------
// PTB tokenization (coco-caption)

TEST(ptb_tokenize, splits_and_filters_like_corenlp) {
    using ecokv::metrics::ptb_tokenize;
    EXPECT_EQ(ptb_tokenize("A man's hat."), (strings{ "a", "man", "'s", "hat" }));
    EXPECT_EQ(ptb_tokenize("Don't stop!"), (strings{ "do", "n't", "stop" }));
    EXPECT_EQ(ptb_tokenize("It\u2019s 5:30 p.m. in the U.S."),
              (strings{ "it", "'s", "5:30", "p.m.", "in", "the", "u.s." }));
    EXPECT_EQ(ptb_tokenize("A \"STOP\" sign (red)"), (strings{ "a", "stop", "sign", "-lrb-", "red", "-rrb-" }));
    EXPECT_EQ(ptb_tokenize("e-mail, 1,000 dollars; $5 - 50% off..."),
              (strings{ "e-mail", "1,000", "dollars", "$", "5", "50", "%", "off" }));
    EXPECT_EQ(ptb_tokenize("I cannot"), (strings{ "i", "can", "not" }));
    EXPECT_EQ(ptb_tokenize("rock'n'roll at 3 o'clock"), (strings{ "rock", "'n'", "roll", "at", "3", "o'clock" }));
    EXPECT_EQ(ptb_tokenize("www.Example.com and/or 3.5-inch"), (strings{ "www.example.com", "and/or", "3.5-inch" }));
    EXPECT_EQ(ptb_tokenize("Wow!! Really?"), (strings{ "wow", "!!", "really" }));  // [?!]+ is one token
    EXPECT_EQ(ptb_tokenize("Mr. Smith, etc. -- no."), (strings{ "mr.", "smith", "etc.", "no." }));
    EXPECT_EQ(ptb_tokenize("the dogs' bowl"), (strings{ "the", "dogs", "bowl" }));
    EXPECT_EQ(ptb_tokenize("a|b\\c"), (strings{ "a", "b", "c" }));  // deleted characters
    EXPECT_EQ(ptb_tokenize(" \n. , ; : ? !"), strings{});
}

// ---------------------------------------------------------------------------------------------------------------
// rougel

TEST(rougel, lcs_f_measure_by_hand) {
    using ecokv::metrics::rouge_l;
    const double b2 = 1.2 * 1.2;
    // P = R = 4/6 (LCS cat on the mat): F = P.
    EXPECT_DOUBLE_EQ(rouge_l("a cat sat on the mat", strings{ "the cat is on the mat" }), 4.0 / 6.0);
    // LCS 2 of 2 and 4 tokens: P = 1, R = 0.5.
    EXPECT_NEAR(rouge_l("The cat.", strings{ "the cat sat down" }), (1 + b2) * 0.5 / (0.5 + b2), 1e-15);
    // Maxima from different references: "the cat" gives P 2/3, R 1; "cat sat ... today" gives P 2/3, R 2/6.
    EXPECT_NEAR(rouge_l("the cat sat", strings{ "the cat", "cat sat on the mat today" }),
                (1 + b2) * (2.0 / 3.0) / (1 + b2 * 2.0 / 3.0), 1e-15);
    EXPECT_EQ(rouge_l("zebra", strings{ "the cat" }), 0.0);
    EXPECT_EQ(rouge_l("", strings{ "" }), 1.0);  // "".split(" ") == [""] on both sides: LCS 1 of 1
    EXPECT_EQ(rouge_l("", strings{ "a b" }), 0.0);
}

// ---------------------------------------------------------------------------------------------------------------
// cider

TEST(cider, identical_bigram_caption_on_a_two_image_corpus) {
    // Image A: "a b" vs "a b"; image B: "c d" vs "e f". N = 2, ref_len = log 2; every reference n-gram has
    // df 1, and unseen ones df 0 -> log(max(1, 0)) = 0, so every weight is log 2.
    // A: n=1 cosine 1, n=2 cosine 1, n=3,4 empty (0, norms 0: no division); delta 0 -> (1 + 1 + 0 + 0) / 4 * 10.
    const std::vector<metric_item> items = { { "a b", { "a b" }, "" }, { "c d", { "e f" }, "" } };
    const std::vector<double>      s     = ecokv::metrics::cider_d(items);
    ASSERT_EQ(s.size(), 2u);
    EXPECT_DOUBLE_EQ(s[0], 5.0);
    EXPECT_DOUBLE_EQ(s[1], 0.0);
    EXPECT_DOUBLE_EQ(ecokv::evaluate("cider", items).score, 2.5);
}

TEST(cider, four_grams_and_length_penalty_by_hand) {
    // Identical 4-word captions: all four cosines 1 -> 10.
    const std::vector<metric_item> same = { { "a b c d", { "a b c d" }, "" }, { "x", { "y" }, "" } };
    EXPECT_DOUBLE_EQ(ecokv::metrics::cider_d(same)[0], 10.0);
    // "a b c" vs "a b" (weights all log 2 as above): n=1 cosine 2 / (sqrt 3 * sqrt 2), n=2 1 / sqrt 2,
    // n=3 0 (the reference has no 3-gram); 2-gram lengths 2 vs 1 -> penalty e^(-1 / 72).
    const std::vector<metric_item> longer = { { "a b c", { "a b" }, "" }, { "x y", { "z w" }, "" } };
    const double want = (2 / std::sqrt(6.0) + 1 / std::sqrt(2.0)) * std::pow(std::numbers::e, -1.0 / 72) / 4 * 10;
    EXPECT_NEAR(ecokv::metrics::cider_d(longer)[0], want, 1e-12);
    EXPECT_NEAR(want, 3.7564711970301365, 1e-12);  // reference.py
}

TEST(cider, clipping_and_reference_average) {
    // One image of interest plus an unrelated one (weights log 2 again). "a a" vs refs "a" and "b":
    // n=1: hyp a -> 2L (norm 2L); ref "a": a -> L (norm L); clipped dot min(2L, L) * L = L^2 -> cosine 1/2.
    // ref "b": no overlap. 2-gram lengths 1 vs 0 -> e^(-1/72). Sum over refs / 4 / 2 refs * 10.
    const std::vector<metric_item> items = { { "a a", { "a", "b" }, "" }, { "x", { "y" }, "" } };
    const double                   want  = 0.5 * std::pow(std::numbers::e, -1.0 / 72) / 4 / 2 * 10;
    EXPECT_NEAR(ecokv::metrics::cider_d(items)[0], want, 1e-12);
}

TEST(cider, one_image_is_zero) {
    // ref_len = log 1 = 0 and every df is 1: all tf-idf weights vanish (pycocoevalcap does the same).
    const std::vector<metric_item> items = { { "a b", { "a b" }, "" } };
    EXPECT_EQ(ecokv::metrics::cider_d(items)[0], 0.0);
}

TEST(cider, punctuation_and_case_are_tokenized_away) {
    const std::vector<metric_item> raw = { { "A Red, STOP sign!", { "a red stop sign" }, "" }, { "x", { "y" }, "" } };
    const std::vector<metric_item> tok = { { "a red stop sign", { "a red stop sign" }, "" }, { "x", { "y" }, "" } };
    EXPECT_DOUBLE_EQ(ecokv::metrics::cider_d(raw)[0], ecokv::metrics::cider_d(tok)[0]);
    EXPECT_DOUBLE_EQ(ecokv::metrics::cider_d(raw)[0], 10.0);
}

// ---------------------------------------------------------------------------------------------------------------
// robustness: arbitrary bytes (invalid UTF-8 included) through every per-item function

TEST(metrics_robustness, random_text_never_breaks_a_metric) {
    const std::vector<std::string> atoms = { "a", "B", "7", ".", ",", "'", "\"", "-", "--", "...", "(", ")", "<b>",
                                             "n't", "'s", " ", "\n", "\t", "%", "$", "/", "\\", "|", "_", "e.g.",
                                             "\xC3\xA9", "\xE2\x80\x99", "\xE2\x80\x94", "\xF0\x9F\x98\x80",
                                             "\xFF", "\xC3", "\xED\xA0\x80", "inf", "1e400", "_1" };
    uint64_t state = 12345;
    const auto next = [&] {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return size_t(state >> 33);
    };
    const auto text = [&] {
        std::string s;
        for (size_t k = next() % 12; k > 0; --k) {
            s += atoms[next() % atoms.size()];
        }
        return s;
    };
    std::vector<metric_item> items;
    for (int i = 0; i < 500; ++i) {
        const std::string pred = text();
        const strings     answers = { text(), text() };
        for (const std::string & t : ecokv::metrics::ptb_tokenize(pred)) {
            EXPECT_FALSE(t.empty()) << pred;
            EXPECT_EQ(t.find_first_of(" \t\n"), std::string::npos) << pred;
        }
        const double a = ecokv::metrics::anls(pred, answers);
        EXPECT_TRUE(a == 0.0 || (a >= 0.5 && a <= 1.0)) << pred;
        const double c = ecokv::metrics::char_accuracy(pred, answers);
        EXPECT_TRUE(c >= 0.0 && c <= 1.0) << pred;
        const double v = ecokv::metrics::vqa_accuracy(pred, answers);
        EXPECT_TRUE(v >= 0.0 && v <= 1.0) << pred;
        const double r = ecokv::metrics::rouge_l(pred, answers);
        EXPECT_TRUE(r >= 0.0 && r <= 1.0) << pred;
        ecokv::metrics::relaxed_accuracy(pred, answers);
        ecokv::metrics::exact_match(pred, answers);
        ecokv::metrics::ocrbench_correct(pred, answers, i % 2 ? k_hme : "Doc-oriented VQA");
        items.push_back({ pred, answers, "Doc-oriented VQA" });
    }
    for (double c : ecokv::metrics::cider_d(items)) {
        EXPECT_TRUE(std::isfinite(c) && c >= 0.0) << c;
    }
    // Results with arbitrary type names still print as valid JSON.
    EXPECT_NO_THROW(json::parse(ecokv::metric_result_json(ecokv::evaluate("ocrbench", items))));
}

// ---------------------------------------------------------------------------------------------------------------
// golden cases from tests/data/metrics/reference.py

TEST(metrics_golden, agree_with_the_python_reference) {
    std::ifstream in(k_data + "/golden.jsonl");
    ASSERT_TRUE(in) << "missing " << k_data << "/golden.jsonl";
    std::vector<metric_item>   captions;
    std::vector<double>        cider_want;
    std::map<std::string, int> counts;
    std::string                line;
    for (int line_no = 1; std::getline(in, line); ++line_no) {
        const json        j       = json::parse(line);
        const std::string metric  = j["metric"];
        const std::string pred    = j["prediction"];
        const strings     answers = j["answers"];
        const double      want    = j["score"];
        counts[metric] += 1;
        const std::string where = "golden.jsonl:" + std::to_string(line_no) + " " + line;
        if (metric == "vqa") {
            EXPECT_EQ(ecokv::metrics::vqa_normalize(pred), j["normalized"].get<std::string>()) << where;
            EXPECT_NEAR(ecokv::metrics::vqa_accuracy(pred, answers), want, 1e-12) << where;
        } else if (metric == "anls") {
            EXPECT_NEAR(ecokv::metrics::anls(pred, answers), want, 1e-12) << where;
        } else if (metric == "relaxed") {
            EXPECT_EQ(ecokv::metrics::relaxed_accuracy(pred, answers), want) << where;
        } else if (metric == "ocrbench") {
            EXPECT_EQ(ecokv::metrics::ocrbench_correct(pred, answers, j["type"].get<std::string>()), want == 1.0)
                << where;
        } else if (metric == "rougel") {
            EXPECT_NEAR(ecokv::metrics::rouge_l(pred, answers), want, 1e-12) << where;
        } else if (metric == "cider") {
            captions.push_back({ pred, answers, "" });
            cider_want.push_back(want);
        } else {
            ADD_FAILURE() << where;
        }
    }
    const std::vector<double> got = ecokv::metrics::cider_d(captions);
    ASSERT_EQ(got.size(), cider_want.size());
    for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], cider_want[i], 1e-12) << "cider item " << i;
    }
    for (const char * m : { "vqa", "anls", "relaxed", "ocrbench", "rougel", "cider" }) {
        EXPECT_GE(counts[m], 40) << m;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// the JSON Lines reader


TEST(read_metric_items, reads_answers_types_and_skips_blank_lines) {
    temp_dir          d;
    const std::string p     = d.write("a.jsonl",
                                      "{\"prediction\": \"x\", \"answers\": [\"a\", \"b\"], \"id\": 7}\n"
                                          "\n   \n"
                                          "{\"prediction\": \"y\", \"answers\": \"c\", \"type\": \"T\"}\r\n");
    const auto        items = ecokv::read_metric_items(p);
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[0].prediction, "x");
    EXPECT_EQ(items[0].answers, (strings{ "a", "b" }));
    EXPECT_EQ(items[0].type, "");
    EXPECT_EQ(items[1].answers, strings{ "c" });
    EXPECT_EQ(items[1].type, "T");
}

TEST(read_metric_items, errors_name_the_file_and_line) {
    temp_dir   d;
    const auto err = [&](const std::string & body, std::string_view metric = {}) {
        const std::string p = d.write("bad.jsonl", "{\"prediction\": \"ok\", \"answers\": [\"ok\"]}\n\n" + body + "\n");
        return error_of([&] { ecokv::read_metric_items(p, metric); }).substr(p.size());
    };
    EXPECT_EQ(err("{\"answers\": [\"a\"]}"), ":3: missing \"prediction\"");
    EXPECT_EQ(err("{\"prediction\": 5, \"answers\": [\"a\"]}"), ":3: \"prediction\" must be a string");
    EXPECT_EQ(err("{\"prediction\": \"a\"}"), ":3: missing \"answers\"");
    EXPECT_EQ(err("{\"prediction\": \"a\", \"answers\": []}"),
              ":3: \"answers\" must be a non-empty array of strings (or one string)");
    EXPECT_EQ(err("{\"prediction\": \"a\", \"answers\": [\"a\", 2]}"), ":3: \"answers\" must hold strings only");
    EXPECT_EQ(err("{\"prediction\": \"a\", \"answers\": [\"a\"], \"type\": 1}"), ":3: \"type\" must be a string");
    EXPECT_EQ(err("[1, 2]"), ":3: expected a JSON object");
    EXPECT_EQ(err("{\"prediction\": \"a\", \"answers\": [\"a\"]}", "ocrbench"),
              ":1: missing \"type\" (the metric needs each item's question type)");
    EXPECT_EQ(err("{\"prediction\": \"a\", \"answers\": [\"a\"]"),
              ":3: invalid JSON at column 37: syntax error while parsing object - unexpected end of input; "
              "expected '}'");
    EXPECT_EQ(err("{\"prediction\": \"a\", \"answers\": [\"a\"], \"w\": -1e309}"),
              ":3: number -1e309 is out of range (beyond a double)");
}

TEST(read_metric_items, missing_empty_and_unknown) {
    temp_dir          d;
    const std::string missing = d.path().string() + "/none.jsonl";
    EXPECT_EQ(error_of([&] { ecokv::read_metric_items(missing); }),
              missing + ": cannot open: No such file or directory");
    const std::string empty = d.write("empty.jsonl", "\n\n");
    EXPECT_EQ(error_of([&] { ecokv::read_metric_items(empty); }),
              empty + ": no items (expected one JSON object per line)");
    const std::string ok = d.write("ok.jsonl", "{\"prediction\": \"a\", \"answers\": \"a\"}\n");
    EXPECT_EQ(error_of([&] { ecokv::read_metric_items(ok, "nope"); }),
              "unknown metric 'nope'; known: exact, relaxed, vqa, anls, chars, cider, rougel, ocrbench");
}

// ---------------------------------------------------------------------------------------------------------------
// ecokv metric, end to end

std::string quote(const std::string & s) {
    std::string out = "'";
    for (char c : s) {
        out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    }
    return out + "'";
}

struct run_result {
    int         code = -1;
    std::string out, err;
};

run_result run_metric(const temp_dir & d, const strings & args) {
    std::string cmd = quote(ECOKV_CLI) + " metric";
    for (const std::string & a : args) {
        cmd += " " + quote(a);
    }
    const std::string out = d.path().string() + "/stdout", err = d.path().string() + "/stderr";
    const int         status = std::system((cmd + " >" + quote(out) + " 2>" + quote(err) + " </dev/null").c_str());
    run_result        r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ostringstream o, e;
    o << std::ifstream(out).rdbuf();
    e << std::ifstream(err).rdbuf();
    r.out = o.str();
    r.err = e.str();
    return r;
}

TEST(metric_cli, ocrbench_fixture) {
    temp_dir         d;
    const run_result r = run_metric(d, { "--metric", "ocrbench", "--input", k_data + "/ocrbench-mini.jsonl" });
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    // 1 "STOP." contains "stop"; 2 no; 3 HME without spaces matches; 4 HME keeps case: no; 5 "\n" read as ' '.
    const json j = json::parse(r.out);
    EXPECT_EQ(j["metric"], "ocrbench");
    EXPECT_DOUBLE_EQ(j["score"].get<double>(), 0.6);
    EXPECT_EQ(j["n"], 5);
    EXPECT_EQ(j["correct"], 3);
    EXPECT_EQ(j["by_type"]["Regular Text Recognition"], json::parse(R"({"score": 0.5, "correct": 1, "n": 2})"));
    EXPECT_EQ(j["by_type"][k_hme], json::parse(R"({"score": 0.5, "correct": 1, "n": 2})"));
    EXPECT_EQ(j["by_type"]["Key Information Extraction"], json::parse(R"({"score": 1.0, "correct": 1, "n": 1})"));
    EXPECT_EQ(r.out.back(), '\n');
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1);
}

TEST(metric_cli, vqa_and_caption_fixtures) {
    temp_dir d;
    // Item 1: "2 dogs" and "two dogs" match (2 of 10) -> 0.6; item 2: "don't" x4 (dont, Don't included) -> 1.
    run_result r = run_metric(d, { "-m", "vqa", "-i", k_data + "/vqa-mini.jsonl" });
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out), json::parse(R"({"metric": "vqa", "score": 0.8, "n": 2})"));
    // After PTB tokenization: "a red stop sign" and "a bottle of coca-cola"; values from reference.py on those
    // tokens (CIDEr 6.1296432786821775 and 6.1180809927295075; ROUGE-L 1 and 0.693181818181818).
    r = run_metric(d, { "--metric", "cider", "--input", k_data + "/captions-mini.jsonl" });
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NEAR(json::parse(r.out)["score"].get<double>(), 6.123862135705842, 1e-12);
    r = run_metric(d, { "--metric", "rougel", "--input", k_data + "/captions-mini.jsonl" });
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NEAR(json::parse(r.out)["score"].get<double>(), 0.846590909090909, 1e-12);
}

TEST(metric_cli, list_and_help) {
    temp_dir d;
    for (const strings & args : { strings{ "--list" }, strings{ "--help" } }) {
        const run_result r = run_metric(d, args);
        EXPECT_EQ(r.code, 0) << r.err;
        for (const auto & m : ecokv::list_metrics()) {
            EXPECT_NE(r.out.find(m.name + " "), std::string::npos) << m.name << "\n" << r.out;
        }
    }
    EXPECT_NE(run_metric(d, { "--help" }).out.find("--input"), std::string::npos);
}

TEST(metric_cli, errors_exit_1_with_a_message_and_no_output) {
    temp_dir          d;
    const std::string bad =
        d.write("bad.jsonl", "{\"prediction\": \"a\", \"answers\": [\"a\"]}\n{\"prediction\": \"b\"}\n");
    const std::string                                  ok    = k_data + "/vqa-mini.jsonl";
    const std::vector<std::pair<strings, std::string>> cases = {
        { { "--metric", "bleu", "--input", ok },
          "ecokv metric: error: unknown metric 'bleu'; known: exact, relaxed, vqa, anls, chars, cider, rougel, ocrbench\n" },
        { { "--metric", "vqa" }, "ecokv metric: error: missing --input (see --help)\n" },
        { { "--input", ok }, "ecokv metric: error: missing --metric (see --help)\n" },
        { { "--metric", "vqa", "--input", bad }, "ecokv metric: error: " + bad + ":2: missing \"answers\"\n" },
        { { "--metric", "ocrbench", "--input", ok },
          "ecokv metric: error: " + ok + ":1: missing \"type\" (the metric needs each item's question type)\n" },
        { { "--metric", "vqa", "--input", ok, "extra" }, "ecokv metric: error: unexpected argument 'extra'\n" },
    };
    for (const auto & [args, want] : cases) {
        const run_result r = run_metric(d, args);
        EXPECT_EQ(r.code, 1) << want;
        EXPECT_EQ(r.out, "") << want;
        EXPECT_EQ(r.err, want);
    }
}

}  // namespace
