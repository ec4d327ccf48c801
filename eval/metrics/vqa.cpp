// vqa: VQA accuracy (Antol et al., ICCV 2015, arXiv:1505.00468) as TextVQA (Singh et al., CVPR 2019,
// arXiv:1904.08920) and VQAv2 are scored.
//
// Reproduces EvalAIAnswerProcessor and TextVQAAccuracyEvaluator in MMF mmf/utils/m4c_evaluators.py (the TextVQA
// authors' evaluator, used verbatim by lmms-eval lmms_eval/tasks/_task_utils/vqa_eval_metric.py and
// tasks/textvqa/utils.py). The processor is applied to the prediction and to every human answer:
//   1. lower(); delete ',' and '?'; "'s" becomes " 's"; strip(); '\n' and '\t' become spaces; strip();
//   2. processPunctuation of GT-Vision-Lab/VQA vqaEval.py: each of ; / [ ] " { } ( ) = + \ _ - > < @ ` , ? !
//      is deleted when the text has it next to a space or has digit,digit, and is replaced by a space otherwise;
//      then periodStrip "(?!<=\d)(\.)(?!\d)", which (its lookbehind is mistyped as a lookahead) deletes every
//      '.' not followed by a digit, at most 32 of them (vqaEval passes re.UNICODE, 32, as sub()'s count);
//   3. processDigitArticle: split(); number words none..ten to digits; drop a, an, the; the contractions table.
// Accuracy: for each human answer i, min(1, #(other answers equal to the prediction) / 3), averaged over i.
// Deviations: vqaEval.py itself lacks step 1 and applies only processPunctuation to the answers, so "a,b" is
// "ab" here and "a b" there; \d and lower() are ASCII-and-text.h rather than full Unicode.
#include "metric-impl.h"
#include "metrics/text.h"

#include <algorithm>
#include <array>
#include <unordered_map>

namespace ecokv {

namespace {

using namespace detail;

const std::array<std::u32string, 21> & punctuation() {
    static const std::array<std::u32string, 21> p = { U";", U"/", U"[", U"]", U"\"", U"{", U"}",
                                                      U"(", U")", U"=", U"+", U"\\", U"_", U"-",
                                                      U">", U"<", U"@", U"`", U",",  U"?", U"!" };
    return p;
}

const std::unordered_map<std::u32string, std::u32string> & number_map() {
    static const std::unordered_map<std::u32string, std::u32string> m = {
        { U"none", U"0" },  { U"zero", U"0" },  { U"one", U"1" },  { U"two", U"2" },
        { U"three", U"3" }, { U"four", U"4" },  { U"five", U"5" }, { U"six", U"6" },
        { U"seven", U"7" }, { U"eight", U"8" }, { U"nine", U"9" }, { U"ten", U"10" },
    };
    return m;
}

// The contractions table of vqaEval.py / EvalAIAnswerProcessor, quirks included ("somebody'd" -> "somebodyd";
// the capitalised keys never match lower-cased text and are kept only to mirror the table).
const std::unordered_map<std::u32string, std::u32string> & contractions() {
    static const std::unordered_map<std::u32string, std::u32string> m = [] {
        // clang-format off
        const char * pairs[][2] = {
            { "aint", "ain't" }, { "arent", "aren't" }, { "cant", "can't" }, { "couldve", "could've" },
            { "couldnt", "couldn't" }, { "couldn'tve", "couldn't've" }, { "couldnt've", "couldn't've" },
            { "didnt", "didn't" }, { "doesnt", "doesn't" }, { "dont", "don't" }, { "hadnt", "hadn't" },
            { "hadnt've", "hadn't've" }, { "hadn'tve", "hadn't've" }, { "hasnt", "hasn't" }, { "havent", "haven't" },
            { "hed", "he'd" }, { "hed've", "he'd've" }, { "he'dve", "he'd've" }, { "hes", "he's" },
            { "howd", "how'd" }, { "howll", "how'll" }, { "hows", "how's" }, { "Id've", "I'd've" },
            { "I'dve", "I'd've" }, { "Im", "I'm" }, { "Ive", "I've" }, { "isnt", "isn't" }, { "itd", "it'd" },
            { "itd've", "it'd've" }, { "it'dve", "it'd've" }, { "itll", "it'll" }, { "let's", "let's" },
            { "maam", "ma'am" }, { "mightnt", "mightn't" }, { "mightnt've", "mightn't've" },
            { "mightn'tve", "mightn't've" }, { "mightve", "might've" }, { "mustnt", "mustn't" },
            { "mustve", "must've" }, { "neednt", "needn't" }, { "notve", "not've" }, { "oclock", "o'clock" },
            { "oughtnt", "oughtn't" }, { "ow's'at", "'ow's'at" }, { "'ows'at", "'ow's'at" },
            { "'ow'sat", "'ow's'at" }, { "shant", "shan't" }, { "shed've", "she'd've" }, { "she'dve", "she'd've" },
            { "she's", "she's" }, { "shouldve", "should've" }, { "shouldnt", "shouldn't" },
            { "shouldnt've", "shouldn't've" }, { "shouldn'tve", "shouldn't've" }, { "somebody'd", "somebodyd" },
            { "somebodyd've", "somebody'd've" }, { "somebody'dve", "somebody'd've" }, { "somebodyll", "somebody'll" },
            { "somebodys", "somebody's" }, { "someoned", "someone'd" }, { "someoned've", "someone'd've" },
            { "someone'dve", "someone'd've" }, { "someonell", "someone'll" }, { "someones", "someone's" },
            { "somethingd", "something'd" }, { "somethingd've", "something'd've" },
            { "something'dve", "something'd've" }, { "somethingll", "something'll" }, { "thats", "that's" },
            { "thered", "there'd" }, { "thered've", "there'd've" }, { "there'dve", "there'd've" },
            { "therere", "there're" }, { "theres", "there's" }, { "theyd", "they'd" }, { "theyd've", "they'd've" },
            { "they'dve", "they'd've" }, { "theyll", "they'll" }, { "theyre", "they're" }, { "theyve", "they've" },
            { "twas", "'twas" }, { "wasnt", "wasn't" }, { "wed've", "we'd've" }, { "we'dve", "we'd've" },
            { "weve", "we've" }, { "werent", "weren't" }, { "whatll", "what'll" }, { "whatre", "what're" },
            { "whats", "what's" }, { "whatve", "what've" }, { "whens", "when's" }, { "whered", "where'd" },
            { "wheres", "where's" }, { "whereve", "where've" }, { "whod", "who'd" }, { "whod've", "who'd've" },
            { "who'dve", "who'd've" }, { "wholl", "who'll" }, { "whos", "who's" }, { "whove", "who've" },
            { "whyll", "why'll" }, { "whyre", "why're" }, { "whys", "why's" }, { "wont", "won't" },
            { "wouldve", "would've" }, { "wouldnt", "wouldn't" }, { "wouldnt've", "wouldn't've" },
            { "wouldn'tve", "wouldn't've" }, { "yall", "y'all" }, { "yall'll", "y'all'll" },
            { "y'allll", "y'all'll" }, { "yall'd've", "y'all'd've" }, { "y'alld've", "y'all'd've" },
            { "y'all'dve", "y'all'd've" }, { "youd", "you'd" }, { "youd've", "you'd've" }, { "you'dve", "you'd've" },
            { "youll", "you'll" }, { "youre", "you're" }, { "youve", "you've" },
        };
        // clang-format on
        std::unordered_map<std::u32string, std::u32string> out;
        for (const auto & p : pairs) {
            out.emplace(u32(p[0]), u32(p[1]));
        }
        return out;
    }();
    return m;
}

// COMMA_STRIP "(?<=\d)(\,)+(?=\d)" found anywhere.
bool has_digit_comma_digit(std::u32string_view s) {
    for (size_t i = 1; i < s.size(); ++i) {
        if (s[i] == U',' && is_ascii_digit(s[i - 1])) {
            size_t j = i;
            while (j < s.size() && s[j] == U',') {
                ++j;
            }
            if (j < s.size() && is_ascii_digit(s[j])) {
                return true;
            }
        }
    }
    return false;
}

std::u32string process_punctuation(const std::u32string & in) {
    std::u32string out          = in;
    const bool     digit_commas = has_digit_comma_digit(in);
    for (const std::u32string & p : punctuation()) {
        // The test reads the input text, not the text as rewritten so far.
        const bool spaced = contains(in, p + U" ") || contains(in, U" " + p);
        out               = replace_all(out, p, (spaced || digit_commas) ? U"" : U" ");
    }
    std::u32string stripped;
    int            removed = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        const bool next_digit = i + 1 < out.size() && is_ascii_digit(out[i + 1]);
        if (out[i] == U'.' && !next_digit && removed < 32) {
            ++removed;
            continue;
        }
        stripped.push_back(out[i]);
    }
    return stripped;
}

std::u32string process_digit_article(const std::u32string & in) {
    std::vector<std::u32string> words;
    for (std::u32string & w : py_split(py_lower(in))) {
        if (const auto it = number_map().find(w); it != number_map().end()) {
            w = it->second;
        }
        if (w != U"a" && w != U"an" && w != U"the") {
            words.push_back(std::move(w));
        }
    }
    for (std::u32string & w : words) {
        if (const auto it = contractions().find(w); it != contractions().end()) {
            w = it->second;
        }
    }
    return join(words, U' ');
}

std::u32string normalize(std::string_view answer) {
    std::u32string s = py_lower(utf8_decode(answer));
    s                = replace_all(replace_all(replace_all(s, U",", U""), U"?", U""), U"'s", U" 's");
    s                = py_strip(replace_all(replace_all(py_strip(s), U"\n", U" "), U"\t", U" "));
    return process_digit_article(process_punctuation(s));
}

}  // namespace

std::string metrics::vqa_normalize(std::string_view answer) {
    return utf8_encode(normalize(answer));
}

double metrics::vqa_accuracy(std::string_view prediction, std::span<const std::string> answers) {
    const std::u32string        pred = normalize(prediction);
    std::vector<std::u32string> gts;
    size_t                      n_match = 0;
    for (const std::string & a : answers) {
        gts.push_back(normalize(a));
        n_match += gts.back() == pred;
    }
    // Leaving out answer i leaves n_match - [answer i matches] matches among the others.
    double sum = 0;
    for (const std::u32string & g : gts) {
        const size_t others = n_match - (g == pred ? 1 : 0);
        sum += std::min(1.0, double(others) / 3.0);
    }
    return sum / double(gts.size());
}

metric_result detail::score_vqa(std::span<const metric_item> items) {
    return mean_over_items(items,
                           [](const metric_item & it) { return metrics::vqa_accuracy(it.prediction, it.answers); });
}

}  // namespace ecokv
