#!/usr/bin/env python3
"""Independent reference for the ecokv metrics: writes golden.jsonl beside this file.

Each function restates the official evaluator's logic in plain Python (standard library only, so it runs
anywhere), using Python's own float(), re, str.lower/strip/split, which the C++ port must match:
  - vqa:     EvalAIAnswerProcessor + TextVQAAccuracyEvaluator (MMF m4c_evaluators.py, lmms-eval textvqa)
  - anls:    infographicsvqa_eval.py (DocVQA RRC script, lmms-eval anls)
  - relaxed: relaxed_correctness (lmms-eval chartqa utils, Qwen-VL evaluate_vqa.py)
  - ocrbench: MultimodalOCR OCRBench/scripts scoring loop
  - cider:   pycocoevalcap CiderScorer (numpy replaced by math; np.mean of 4 values = sum / 4)
  - rougel:  pycocoevalcap Rouge
cider and rougel take captions that are already PTB-tokenized (lower-case words separated by single spaces,
no punctuation), so their cases exercise the scorers, not the Java tokenizer.

Run: python3 tests/data/metrics/reference.py   (regenerates golden.jsonl deterministically)
"""
import json
import math
import os
import random
import re
from collections import defaultdict

# ----------------------------------------------------------------------------------------------------------
# vqa

CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd",
    "howll": "how'll", "hows": "how's", "isnt": "isn't", "itd": "it'd", "itll": "it'll", "maam": "ma'am",
    "mightnt": "mightn't", "mightve": "might've", "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't",
    "oclock": "o'clock", "shant": "shan't", "shouldve": "should've", "shouldnt": "shouldn't",
    "somebody'd": "somebodyd", "thats": "that's", "theres": "there's", "theyre": "they're", "twas": "'twas",
    "wasnt": "wasn't", "weve": "we've", "werent": "weren't", "whats": "what's", "wheres": "where's",
    "whos": "who's", "wont": "won't", "wouldnt": "wouldn't", "yall": "y'all", "youre": "you're",
    "youve": "you've",
}  # the subset the generated cases can reach; the C++ table is the full one
NUMBERS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
           "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = {"a", "an", "the"}
PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")
COMMA = re.compile(r"(?<=\d)(\,)+(?=\d)")
PUNCT = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]


def vqa_normalize(text):
    text = text.lower().replace(",", "").replace("?", "").replace("'s", " 's").strip()
    text = text.replace("\n", " ").replace("\t", " ").strip()
    out = text
    for p in PUNCT:
        if (p + " " in text or " " + p in text) or COMMA.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    out = PERIOD.sub("", out, re.UNICODE)  # re.UNICODE (32) lands in `count`, as in the official script
    words = [NUMBERS.get(w, w) for w in out.lower().split()]
    words = [CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES]
    return " ".join(words)


def vqa_accuracy(pred, answers):
    pred = vqa_normalize(pred)
    gts = [vqa_normalize(a) for a in answers]
    accs = []
    for i in range(len(gts)):
        others = [gts[j] for j in range(len(gts)) if j != i]
        accs.append(min(1, float(sum(1 for o in others if o == pred)) / 3))
    return sum(accs) / len(accs)


# ----------------------------------------------------------------------------------------------------------
# anls


def levenshtein(a, b):
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, row[0] = row[0], i
        for j in range(1, len(b) + 1):
            cur = min(row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] != b[j - 1]))
            prev, row[j] = row[j], cur
    return row[len(b)]


def anls(pred, answers):
    values = []
    for ans in answers:
        gt = " ".join(ans.strip().lower().split())
        det = " ".join(pred.strip().lower().split())
        length = max(len(ans.upper()), len(pred.upper()))
        values.append(0.0 if length == 0 else float(levenshtein(gt, det)) / float(length))
    result = 1 - min(values)
    return 0.0 if result < 0.5 else result


# ----------------------------------------------------------------------------------------------------------
# relaxed


def to_float(text):
    try:
        if text.endswith("%"):
            return float(text.rstrip("%")) / 100.0
        return float(text)
    except ValueError:
        return None


def relaxed(pred, answers):
    pred = pred.strip()
    for target in answers:
        p, t = to_float(pred), to_float(target)
        if p is not None and t:
            ok = abs(p - t) / abs(t) <= 0.05
        else:
            ok = pred.lower() == target.lower()
        if ok:
            return 1.0
    return 0.0


# ----------------------------------------------------------------------------------------------------------
# ocrbench

HME = "Handwritten Mathematical Expression Recognition"


def ocrbench(pred, answers, qtype):
    for a in answers:
        if qtype == HME:
            ans = a.strip().replace("\n", " ").replace(" ", "")
            prd = pred.strip().replace("\n", " ").replace(" ", "")
        else:
            ans = a.lower().strip().replace("\n", " ")
            prd = pred.lower().strip().replace("\n", " ")
        if ans in prd:
            return 1.0
    return 0.0


# ----------------------------------------------------------------------------------------------------------
# cider and rouge (on tokenized captions)


def precook(s, n=4):
    words = s.split()
    counts = defaultdict(int)
    for k in range(1, n + 1):
        for i in range(len(words) - k + 1):
            counts[tuple(words[i:i + k])] += 1
    return counts


def cider(items, n=4, sigma=6.0):
    crefs = [[precook(r) for r in it["answers"]] for it in items]
    ctest = [precook(it["prediction"]) for it in items]
    df = defaultdict(float)
    for refs in crefs:
        for ngram in set(g for ref in refs for g in ref):
            df[ngram] += 1
    ref_len = math.log(float(len(crefs)))

    def counts2vec(cnts):
        vec = [defaultdict(float) for _ in range(n)]
        norm = [0.0] * n
        length = 0
        for ngram, tf in cnts.items():
            d = math.log(max(1.0, df[ngram]))
            k = len(ngram) - 1
            vec[k][ngram] = float(tf) * (ref_len - d)
            norm[k] += vec[k][ngram] ** 2
            if k == 1:
                length += tf
        return vec, [math.sqrt(x) for x in norm], length

    def sim(vh, vr, nh, nr, lh, lr):
        delta = float(lh - lr)
        val = [0.0] * n
        for k in range(n):
            for ngram in vh[k]:
                val[k] += min(vh[k][ngram], vr[k][ngram]) * vr[k][ngram]
            if nh[k] != 0 and nr[k] != 0:
                val[k] /= nh[k] * nr[k]
            val[k] *= math.e ** (-(delta ** 2) / (2 * sigma ** 2))
        return val

    scores = []
    for test, refs in zip(ctest, crefs):
        vec, norm, length = counts2vec(test)
        score = [0.0] * n
        for ref in refs:
            vr, nr, lr = counts2vec(ref)
            score = [a + b for a, b in zip(score, sim(vec, vr, norm, nr, length, lr))]
        scores.append(sum(score) / n / len(refs) * 10.0)
    return scores


def lcs(a, b):
    if len(a) < len(b):
        a, b = b, a
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for j in range(1, len(b) + 1):
        for i in range(1, len(a) + 1):
            table[i][j] = table[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1] else max(table[i - 1][j], table[i][j - 1])
    return table[len(a)][len(b)]


def rouge(pred, refs, beta=1.2):
    c = pred.split(" ")
    prec, rec = [], []
    for r in refs:
        t = r.split(" ")
        m = lcs(t, c)
        prec.append(m / float(len(c)))
        rec.append(m / float(len(t)))
    p, r = max(prec), max(rec)
    return ((1 + beta ** 2) * p * r) / float(r + beta ** 2 * p) if p != 0 and r != 0 else 0.0


# ----------------------------------------------------------------------------------------------------------
# cases


def cases():
    rng = random.Random(20240601)
    words = ["two", "2", "dogs", "dog", "the", "a", "an", "cat", "it's", "its", "dont", "don't", "whats", "none",
             "1,000", "1000", "3.5", "3.", "a.b", "x-y", "x - y", "(red)", "red", "no", "yes", "TEN", "Ten",
             "o'clock", "oclock", "50%", "e.g.", "stop!", "why?", "a,b", "b;c", "Café", "ÉCOLE", "ünï", "\tTab",
             "1/2", "a/b", "under_score", "@home", "C++", "x=1", "#1", "...", "..5", "twas"]
    vqa_cases = []
    for _ in range(120):
        k = rng.choice([1, 3, 10, 10, 10])
        pool = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 3))) for _ in range(3)]
        answers = [rng.choice(pool) for _ in range(k)]
        pred = rng.choice(pool + [rng.choice(words)])
        vqa_cases.append({"prediction": pred, "answers": answers})
    vqa_cases.append({"prediction": "1.2.3.4.5.6.7.8.9.0." + ". " * 40 + "end", "answers": ["x"] * 10})

    strings = ["Hello World", "hello world", "hello  world ", " HELLO\tWORLD", "helo wrld", "Paris", "paris",
               "Pariss", "", " ", "abcdefghij", "abcdefghiX", "abcdeXXXXX", "abcdeXXXXXX", "ab", "a", "b", "Straße",
               "strasse", "1999", "1,999", "ÉCOLE", "école", "x" * 30]
    anls_cases = []
    for _ in range(150):
        anls_cases.append({"prediction": rng.choice(strings),
                           "answers": [rng.choice(strings) for _ in range(rng.randint(1, 3))]})
    anls_cases.append({"prediction": "ab", "answers": ["aX"]})  # NL = 0.5 exactly

    nums = ["100", "105", "106", "95", "94.9", "0", "0.0", "-0", "12%", "0.12", "12.5%", "50%%", "1e2", "1E+2",
            "1_000", "1000", " 7 ", "7", "inf", "-inf", "nan", "NaN", "Yes", "yes", " yes", "1,000", "%", "5.",
            ".5", "0.5", "abc", "ABC", "1e400", "-1e400", "1e-400", "٣", "٣%", "3"]
    relaxed_cases = []
    for _ in range(200):
        relaxed_cases.append({"prediction": rng.choice(nums),
                              "answers": [rng.choice(nums) for _ in range(rng.randint(1, 2))]})

    types = ["Regular Text Recognition", "Scene Text-centric VQA", HME]
    ocr_strings = ["The answer is Stop", "stop", "STOP", "x^{2} + 1", "x ^ { 2 } + 1", "X^{2}+1", "\nstop\n",
                   "a b", "ab", "", "Key: value", "value", "Δ = 5", "δ = 5"]
    ocr_cases = []
    for _ in range(120):
        ocr_cases.append({"prediction": rng.choice(ocr_strings),
                          "answers": [rng.choice(ocr_strings) for _ in range(rng.randint(1, 2))],
                          "type": rng.choice(types)})

    vocab = ["a", "man", "woman", "holding", "sign", "that", "says", "stop", "red", "blue", "car", "with", "the",
             "number", "5", "on", "it", "bottle", "of", "coca", "cola", "'s", "n't", "is", "do"]
    caption_items = []
    for _ in range(40):
        def caption():
            return " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 12)))
        caption_items.append({"prediction": caption(), "answers": [caption() for _ in range(rng.randint(1, 5))]})
    return vqa_cases, anls_cases, relaxed_cases, ocr_cases, caption_items


def main():
    vqa_cases, anls_cases, relaxed_cases, ocr_cases, caption_items = cases()
    lines = []
    for c in vqa_cases:
        lines.append({"metric": "vqa", **c, "normalized": vqa_normalize(c["prediction"]),
                      "score": vqa_accuracy(c["prediction"], c["answers"])})
    for c in anls_cases:
        lines.append({"metric": "anls", **c, "score": anls(c["prediction"], c["answers"])})
    for c in relaxed_cases:
        lines.append({"metric": "relaxed", **c, "score": relaxed(c["prediction"], c["answers"])})
    for c in ocr_cases:
        lines.append({"metric": "ocrbench", **c, "score": ocrbench(c["prediction"], c["answers"], c["type"])})
    for c in caption_items:
        lines.append({"metric": "rougel", **c, "score": rouge(c["prediction"], c["answers"])})
    # One corpus: every caption item with its CIDEr-D (idf over all of them).
    for c, s in zip(caption_items, cider(caption_items)):
        lines.append({"metric": "cider", **c, "score": s})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"wrote {len(lines)} cases to {path}")


if __name__ == "__main__":
    main()
