// The dataset readers (eval/datasets): each official layout read from the small fixtures in tests/data/datasets/
// (copies of the official file structure, a few entries each, 1x1 PNG stand-ins for the images), field by field;
// the errors (missing file, invalid JSON with its line, a bad entry with its index, a missing image with its
// path); and the needle-in-a-haystack generator (determinism, depth, length, answer).
#include "ecokv/datasets.h"
#include "ecokv/error.h"
#include "ecokv/metrics.h"

#include "test-util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <sstream>

namespace {

using namespace ecokv::test;
using ecokv::eval_item;
using strings = std::vector<std::string>;

const std::string k_data = std::string(ECOKV_TEST_DATA) + "/datasets";


// The absolute path of a fixture file, as the readers return it.
std::string fixture(const std::string & rel) {
    return (fs::absolute(k_data) / rel).lexically_normal().string();
}

std::vector<eval_item> load(const std::string & name) {
    return ecokv::load_dataset(name, k_data + "/" + name);
}

// A writable copy of a fixture directory, for the error cases.
struct fixture_copy {
    temp_dir    tmp;
    std::string dir;
    explicit fixture_copy(const std::string & name) : dir(tmp / name) {
        fs::copy(k_data + "/" + name, dir, fs::copy_options::recursive);
    }
};

size_t count_of(const std::string & text, const std::string & what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) {
        ++n;
    }
    return n;
}

size_t words(const std::string & text) {
    std::istringstream in(text);
    size_t             n = 0;
    for (std::string w; in >> w;) {
        ++n;
    }
    return n;
}

// ---------------------------------------------------------------------------------------------------------------
// registry

TEST(dataset_registry, lists_every_dataset_in_order_with_a_registered_metric) {
    strings names;
    for (const auto & d : ecokv::list_datasets()) {
        names.push_back(d.name);
        EXPECT_FALSE(d.description.empty()) << d.name;
        EXPECT_NO_THROW(ecokv::find_metric(d.metric)) << d.name << ": " << d.metric;
    }
    EXPECT_EQ(names, (strings{ "ocrbench", "chartqa", "textvqa", "docvqa", "textcaps", "mpdocvqa", "milebench",
                               "generated", "niah" }));
    EXPECT_EQ(ecokv::find_dataset("ocrbench").metric, "ocrbench");
    EXPECT_EQ(ecokv::find_dataset("chartqa").metric, "relaxed");
    EXPECT_EQ(ecokv::find_dataset("textvqa").metric, "vqa");
    EXPECT_EQ(ecokv::find_dataset("docvqa").metric, "anls");
    EXPECT_EQ(ecokv::find_dataset("textcaps").metric, "cider");
    EXPECT_EQ(ecokv::find_dataset("mpdocvqa").metric, "anls");
    EXPECT_EQ(ecokv::find_dataset("milebench").metric, "exact");
    EXPECT_EQ(ecokv::find_dataset("generated").metric, "exact");
    EXPECT_EQ(ecokv::find_dataset("niah").metric, "exact");
}

// Only the generated niah needs no directory; every other reader refuses an empty one.
TEST(dataset_registry, only_niah_needs_no_directory) {
    strings without;
    for (const auto & d : ecokv::list_datasets()) {
        if (!d.needs_directory) {
            without.push_back(d.name);
        } else {
            EXPECT_EQ(error_of([&] { ecokv::load_dataset(d.name, ""); }), d.name + ": no dataset directory given");
        }
    }
    EXPECT_EQ(without, (strings{ "niah" }));
    EXPECT_EQ(ecokv::load_dataset("niah", "").size(), 20u);  // niah_params::count by default
}

TEST(dataset_registry, unknown_names_list_the_known_ones) {
    const std::string want = "unknown dataset 'vqav2'; known: ocrbench, chartqa, textvqa, docvqa, textcaps, "
                             "mpdocvqa, milebench, generated, niah";
    EXPECT_EQ(error_of([] { ecokv::find_dataset("vqav2"); }), want);
    EXPECT_EQ(error_of([] { ecokv::load_dataset("vqav2", k_data); }), want);
}

// Every file-based fixture loads, with unique ids, absolute existing images and answers; a marker count that
// is 0 or the number of images.
TEST(dataset_registry, every_fixture_loads_with_the_common_guarantees) {
    for (const auto & d : ecokv::list_datasets()) {
        const std::vector<eval_item> items = load(d.name);
        ASSERT_FALSE(items.empty()) << d.name;
        std::set<std::string> ids;
        for (const eval_item & it : items) {
            EXPECT_TRUE(ids.insert(it.id).second) << d.name << ": " << it.id;
            EXPECT_FALSE(it.answers.empty()) << d.name << ": " << it.id;
            for (const std::string & img : it.images) {
                EXPECT_TRUE(fs::path(img).is_absolute()) << img;
                EXPECT_TRUE(fs::is_regular_file(img)) << img;
            }
            const size_t markers = count_of(it.context, std::string(ecokv::image_marker));
            EXPECT_TRUE(markers == 0 || markers == it.images.size()) << d.name << ": " << it.id;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// one reader per layout

TEST(dataset_ocrbench, reads_the_official_list) {
    const std::vector<eval_item> items = load("ocrbench");
    ASSERT_EQ(items.size(), 3u);
    // "id" counts within each source dataset: both first entries have 211.
    EXPECT_EQ(items[0].id, "IIIT5K/211");
    EXPECT_EQ(items[1].id, "IC13_857/211");
    EXPECT_EQ(items[2].id, "HME100k/7");
    EXPECT_EQ(items[0].images, strings{ fixture("ocrbench/OCRBench_Images/IIIT5K/test/137_3.png") });
    EXPECT_EQ(items[1].images, strings{ fixture("ocrbench/OCRBench_Images/IC13_857/imgs/000000212.jpg") });
    EXPECT_EQ(items[0].question, "what is written in the image?");
    EXPECT_EQ(items[0].context, "");
    EXPECT_EQ(items[0].answers, strings{ "TIMES" });  // a string: the only answer
    EXPECT_EQ(items[2].answers, (strings{ "x ^ { 2 } + 1", "x^{2}+1" }));
    EXPECT_EQ(items[0].type, "Regular Text Recognition");
    EXPECT_EQ(items[2].type, "Handwritten Mathematical Expression Recognition");
}

TEST(dataset_ocrbench, a_repeated_source_id_gets_a_suffix) {
    temp_dir tmp;
    fs::create_directories(tmp.path() / "OCRBench_Images");
    tmp.write("OCRBench_Images/a.png", "x");
    const std::string e = R"({"dataset_name": "svt", "id": 3, "image_path": "a.png", "question": "q",
                              "answers": "a", "type": "t"})";
    tmp.write("OCRBench.json", "[" + e + "," + e + "," + e + "]");
    const std::vector<eval_item> items = ecokv::load_dataset("ocrbench", tmp.path().string());
    ASSERT_EQ(items.size(), 3u);
    EXPECT_EQ(items[0].id, "svt/3");
    EXPECT_EQ(items[1].id, "svt/3#2");
    EXPECT_EQ(items[2].id, "svt/3#3");
}

TEST(dataset_chartqa, reads_both_test_files_human_first) {
    const std::vector<eval_item> items = load("chartqa");
    ASSERT_EQ(items.size(), 3u);
    EXPECT_EQ(items[0].id, "human/0");
    EXPECT_EQ(items[1].id, "human/1");
    EXPECT_EQ(items[2].id, "augmented/0");  // the index restarts: the file part keeps the ids apart
    EXPECT_EQ(items[0].images, strings{ fixture("chartqa/png/41699051005347.png") });
    EXPECT_EQ(items[1].images, items[0].images);
    EXPECT_EQ(items[2].images, strings{ fixture("chartqa/png/two_col_40643.png") });
    EXPECT_EQ(items[1].question, "What is the difference in value between Lamb and Corn?");
    EXPECT_EQ(items[1].answers, strings{ "0.57" });
    EXPECT_EQ(items[2].answers, strings{ "18.51" });
    EXPECT_EQ(items[0].type, "human");
    EXPECT_EQ(items[2].type, "augmented");
}

TEST(dataset_chartqa, a_numeric_label_keeps_its_json_spelling) {
    temp_dir tmp;
    fs::create_directories(tmp.path() / "png");
    tmp.write("png/c.png", "x");
    tmp.write("test_human.json", R"([{"imgname": "c.png", "query": "q", "label": 12}])");
    tmp.write("test_augmented.json", R"([{"imgname": "c.png", "query": "q", "label": 0.5}])");
    const std::vector<eval_item> items = ecokv::load_dataset("chartqa", tmp.path().string());
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[0].answers, strings{ "12" });
    EXPECT_EQ(items[1].answers, strings{ "0.5" });
}

TEST(dataset_textvqa, reads_the_val_file_with_ten_answers) {
    const std::vector<eval_item> items = load("textvqa");
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[0].id, "34602");
    EXPECT_EQ(items[1].id, "34604");
    EXPECT_EQ(items[0].images, strings{ fixture("textvqa/train_images/003a8ae2ef43b901.jpg") });
    EXPECT_EQ(items[0].question, "what is the brand of this camera?");
    EXPECT_EQ(items[0].answers, (strings{ "nous les gosses", "dakota", "clos culombu", "dakota digital", "dakota",
                                          "dakota", "dakota digital", "dakota digital", "dakota", "dakota" }));
    EXPECT_EQ(items[1].answers.size(), 10u);
    EXPECT_EQ(items[0].type, "");
}

TEST(dataset_docvqa, reads_the_file_with_question_types) {
    const std::vector<eval_item> items = load("docvqa");
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[0].id, "49153");
    EXPECT_EQ(items[0].images, strings{ fixture("docvqa/documents/pybv0228_81.png") });
    EXPECT_EQ(items[0].question, "What is the \u2018actual\u2019 value per 1000, during the year 1975?");
    EXPECT_EQ(items[0].answers, strings{ "0.28" });
    EXPECT_EQ(items[0].type, "figure/diagram");
    EXPECT_EQ(items[1].id, "24580");
    EXPECT_EQ(items[1].answers,
              (strings{ "university of california", "University of California",
                        "university of california, san diego" }));
    EXPECT_EQ(items[1].type, "handwritten,form");
}

TEST(dataset_docvqa, falls_back_to_the_file_without_types) {
    fixture_copy c("docvqa");
    fs::rename(c.dir + "/val_v1.0_withQT.json", c.dir + "/val_v1.0.json");
    const std::vector<eval_item> items = ecokv::load_dataset("docvqa", c.dir);
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[1].id, "24580");
    // The same entries still carry their types; a file without them gives an empty type.
    write_file(c.dir + "/val_v1.0.json", R"({"data": [{"questionId": 1, "question": "q",
        "image": "documents/nkbl0226_1.png", "answers": ["a"]}]})");
    const std::vector<eval_item> plain = ecokv::load_dataset("docvqa", c.dir);
    ASSERT_EQ(plain.size(), 1u);
    EXPECT_EQ(plain[0].type, "");
    EXPECT_EQ(plain[0].images, strings{ (fs::path(c.dir) / "documents/nkbl0226_1.png").string() });
}

TEST(dataset_textcaps, one_item_per_image_with_its_references) {
    const std::vector<eval_item> items = load("textcaps");
    ASSERT_EQ(items.size(), 2u);  // 4 caption entries over 2 images
    EXPECT_EQ(items[0].id, "011e7e629fb9ae7b");
    EXPECT_EQ(items[1].id, "0a1f6e1d3e9c1c3e");
    EXPECT_EQ(items[0].images, strings{ fixture("textcaps/train_images/011e7e629fb9ae7b.jpg") });
    EXPECT_EQ(items[0].question, "Please carefully observe the image and come up with a caption for the image.");
    EXPECT_EQ(items[1].question, items[0].question);
    ASSERT_EQ(items[0].answers.size(), 5u);
    EXPECT_EQ(items[0].answers[0], "A bottle of Coca-Cola sits on a wooden table.");
    EXPECT_EQ(items[1].answers[1], "a red stop sign on a pole");
}

TEST(dataset_textcaps, without_reference_strs_the_captions_are_collected) {
    temp_dir tmp;
    fs::create_directories(tmp.path() / "train_images");
    tmp.write("train_images/a.jpg", "x");
    tmp.write("TextCaps_0.1_val.json", R"({"data": [{"image_id": "a", "caption_str": "one"},
        {"image_id": "a", "caption_str": "two"}]})");
    const std::vector<eval_item> items = ecokv::load_dataset("textcaps", tmp.path().string());
    ASSERT_EQ(items.size(), 1u);
    EXPECT_EQ(items[0].answers, (strings{ "one", "two" }));
}

TEST(dataset_mpdocvqa, gives_every_page_in_order) {
    const std::vector<eval_item> items = load("mpdocvqa");
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[0].id, "49153");
    EXPECT_EQ(items[0].images, (strings{ fixture("mpdocvqa/images/pybv0228_p80.jpg"),
                                         fixture("mpdocvqa/images/pybv0228_p81.jpg"),
                                         fixture("mpdocvqa/images/pybv0228_p82.jpg") }));
    EXPECT_EQ(items[0].context, "");
    EXPECT_EQ(items[0].answers, strings{ "0.28" });
    EXPECT_EQ(items[0].type, "pages=3");
    EXPECT_EQ(items[1].id, "57349");
    EXPECT_EQ(items[1].images, strings{ fixture("mpdocvqa/images/xnbl0037_p0.jpg") });
    EXPECT_EQ(items[1].question, "what is the date mentioned in this letter?");
    EXPECT_EQ(items[1].type, "pages=1");
}

TEST(dataset_milebench, reads_every_task_in_name_order) {
    const std::vector<eval_item> items = load("milebench");
    ASSERT_EQ(items.size(), 3u);
    EXPECT_EQ(items[0].id, "TextNeedleInAHaystack/0");
    EXPECT_EQ(items[1].id, "TextNeedleInAHaystack/1");
    EXPECT_EQ(items[2].id, "WebQA/0");
    EXPECT_EQ(items[0].type, "TextNeedleInAHaystack");
    EXPECT_EQ(items[2].type, "WebQA");
}

TEST(dataset_milebench, the_needle_task_interleaves_images_with_the_context) {
    const std::vector<eval_item> items = load("milebench");
    const std::string            m(ecokv::image_marker);
    const eval_item &            it = items[0];
    EXPECT_EQ(it.images, (strings{ fixture("milebench/TextNeedleInAHaystack/images/0_0.jpg"),
                                   fixture("milebench/TextNeedleInAHaystack/images/0_1.jpg"),
                                   fixture("milebench/TextNeedleInAHaystack/images/0_2.jpg") }));
    // task_instruction[1] + "\n" + the context, {image#k} replaced by the marker.
    EXPECT_EQ(it.context, "Below are images and text with a hidden password. \n" + m +
                              "The first picture shows a quiet street in the morning. Somewhere in these pages a "
                              "password is hidden. " +
                              m + "The second picture shows a busy market. The password is 'ZEBRA-42'. Remember it. " +
                              m + "The third picture shows a harbour at night.\nQuestion: What is the password? "
                                  "Answer with the password only.");
    EXPECT_EQ(it.question, "");  // open-ended: the question ends the context
    EXPECT_EQ(it.answers, strings{ "ZEBRA-42" });
}

TEST(dataset_milebench, images_without_a_placeholder_come_first) {
    const std::vector<eval_item> items = load("milebench");
    const std::string            m(ecokv::image_marker);
    // Only {image#2} is in the context: image 1 goes to the start of the task context.
    EXPECT_EQ(items[1].context, "Read the interleaved images and text, then answer the question. \n" + m + m +
                                    "Text after the second image. The password is 'OTTER-7'.\nQuestion: What is the "
                                    "password?");
    EXPECT_EQ(items[1].images.size(), 2u);
}

TEST(dataset_milebench, multi_choice_puts_the_choices_in_the_question) {
    const std::vector<eval_item> items = load("milebench");
    const eval_item &            it    = items[2];
    EXPECT_EQ(it.images, (strings{ fixture("milebench/WebQA/images/0.jpg"), fixture("milebench/WebQA/images/1.jpg") }));
    EXPECT_EQ(it.question, "Choice list: \nA. They have the same number.\nB. The Wurlitzer organ.\n"
                           "C. The Western Cottage pump organ.\nYour answer is: ");
    EXPECT_EQ(it.answers, (strings{ "The Western Cottage pump organ.", "C" }));
    EXPECT_EQ(count_of(it.context, std::string(ecokv::image_marker)), 2u);
}

TEST(dataset_milebench, one_task_directory_reads_that_task) {
    const std::vector<eval_item> items = ecokv::load_dataset("milebench", k_data + "/milebench/WebQA");
    ASSERT_EQ(items.size(), 1u);
    EXPECT_EQ(items[0].id, "WebQA/0");
}

TEST(dataset_generated, reads_items_jsonl) {
    const std::vector<eval_item> items = load("generated");
    ASSERT_EQ(items.size(), 3u);
    EXPECT_EQ(items[0].id, "1");  // no "id": the line number
    EXPECT_EQ(items[0].images, strings{ fixture("generated/img/red-square.png") });
    EXPECT_EQ(items[0].context, "");
    EXPECT_EQ(items[0].question, "What color is the square?");
    EXPECT_EQ(items[0].answers, strings{ "red" });
    EXPECT_EQ(items[0].type, "color");
    EXPECT_EQ(items[1].id, "count-0001");
    EXPECT_EQ(items[1].images,
              (strings{ fixture("generated/img/red-square.png"), fixture("generated/img/two-dots.png") }));
    EXPECT_EQ(items[1].context, "Look at both pictures.");
    EXPECT_EQ(items[1].answers, (strings{ "2", "two" }));
    EXPECT_EQ(items[2].id, "4");  // line 2 is blank
    EXPECT_TRUE(items[2].images.empty());
    EXPECT_EQ(items[2].answers, strings{ "blue" });
    EXPECT_EQ(items[2].type, "text");
}

TEST(dataset_generated, a_relative_directory_gives_absolute_paths) {
    struct cwd_guard {
        fs::path saved = fs::current_path();
        ~cwd_guard() { fs::current_path(saved); }
    } guard;
    fs::current_path(k_data);
    const std::vector<eval_item> items = ecokv::load_dataset("generated", "generated/");
    ASSERT_EQ(items.size(), 3u);
    EXPECT_EQ(items[0].images, strings{ fixture("generated/img/red-square.png") });
}

// ---------------------------------------------------------------------------------------------------------------
// errors

TEST(dataset_errors, an_empty_directory_names_the_expected_file) {
    const std::vector<std::pair<std::string, std::string>> want = {
        { "ocrbench", "/OCRBench.json: no such file" },
        { "chartqa", "/test_human.json: no such file" },
        { "textvqa", "/TextVQA_0.5.1_val.json: no such file" },
        { "docvqa", ": none of val_v1.0_withQT.json, val_v1.0.json found" },
        { "textcaps", "/TextCaps_0.1_val.json: no such file" },
        { "mpdocvqa", "/val.json: no such file" },
        { "milebench", ": no MileBench task (expected <task>/<task>.json" },
        { "generated", "/items.jsonl: no such file" },
    };
    temp_dir tmp;
    for (const auto & [name, part] : want) {
        const std::string msg = error_of([&, dataset = name] { ecokv::load_dataset(dataset, tmp.path().string()); });
        EXPECT_EQ(msg.rfind(tmp.path().string(), 0), 0u) << name << ": " << msg;
        EXPECT_TRUE(contains(msg, part)) << name << ": " << msg;
    }
}

TEST(dataset_errors, chartqa_needs_both_files) {
    fixture_copy c("chartqa");
    fs::remove(c.dir + "/test_augmented.json");
    EXPECT_EQ(error_of([&] { ecokv::load_dataset("chartqa", c.dir); }), c.dir + "/test_augmented.json: no such file");
}

TEST(dataset_errors, a_missing_directory_is_named) {
    temp_dir          tmp;
    const std::string dir = tmp / "nowhere";
    EXPECT_EQ(error_of([&] { ecokv::load_dataset("textvqa", dir); }), "textvqa: " + dir + ": no such directory");
    EXPECT_EQ(error_of([&] { ecokv::load_dataset("textvqa", ""); }), "textvqa: no dataset directory given");
    EXPECT_EQ(error_of([&] { ecokv::load_dataset("niah", dir); }), "niah: " + dir + ": no such directory");
}

TEST(dataset_errors, invalid_json_names_the_line) {
    temp_dir tmp;
    tmp.write("OCRBench.json", "[\n  {\"dataset_name\": \"svt\",\n   \"id\": 3,,\n}]\n");
    const std::string msg = error_of([&] { ecokv::load_dataset("ocrbench", tmp.path().string()); });
    EXPECT_EQ(msg.rfind(tmp / "OCRBench.json:3: invalid JSON at column 12: syntax error", 0), 0u) << msg;

    tmp.write("OCRBench.json", "");
    EXPECT_TRUE(contains(error_of([&] { ecokv::load_dataset("ocrbench", tmp.path().string()); }),
                         tmp / "OCRBench.json:1: invalid JSON at column 1:"));
}

TEST(dataset_errors, a_bad_entry_is_named_by_its_index) {
    fixture_copy c("textvqa");
    const std::string path = c.dir + "/TextVQA_0.5.1_val.json";
    auto              load = [&] { return error_of([&] { ecokv::load_dataset("textvqa", c.dir); }); };

    write_file(path, R"({"data": [{"question_id": 1, "image_id": "003a8ae2ef43b901", "question": "q",
        "answers": ["a"]}, {"question_id": 2, "image_id": "003a8ae2ef43b901", "question": "q"}]})");
    EXPECT_EQ(load(), path + ": data[1]: missing \"answers\"");

    write_file(path, R"({"data": [{"question_id": 1, "image_id": "003a8ae2ef43b901", "question": 5,
        "answers": ["a"]}]})");
    EXPECT_EQ(load(), path + ": data[0]: \"question\" must be a string, not number");

    write_file(path, R"({"data": [{"question_id": 1, "image_id": "003a8ae2ef43b901", "question": "q",
        "answers": ["a", 3]}]})");
    EXPECT_EQ(load(), path + ": data[0]: \"answers\"[1] must be a string, not number");

    write_file(path, R"({"data": [{"question_id": 1, "image_id": "003a8ae2ef43b901", "question": "q",
        "answers": []}]})");
    EXPECT_EQ(load(), path + ": data[0]: \"answers\" is empty (at least one answer is needed)");

    write_file(path, R"({"data": [7]})");
    EXPECT_EQ(load(), path + ": data[0]: expected an object, not number");

    write_file(path, R"({"questions": []})");
    EXPECT_EQ(load(), path + ": missing \"data\"");

    write_file(path, R"({"data": {}})");
    EXPECT_EQ(load(), path + ": \"data\" must be an array, not object");

    write_file(path, R"({"data": []})");
    EXPECT_EQ(load(), "textvqa: no items in " + c.dir);
}

TEST(dataset_errors, the_test_splits_without_answers_are_refused) {
    fixture_copy c("mpdocvqa");
    write_file(c.dir + "/val.json", R"({"data": [{"questionId": 1, "question": "q", "page_ids": ["xnbl0037_p0"]}]})");
    EXPECT_EQ(error_of([&] { ecokv::load_dataset("mpdocvqa", c.dir); }),
              c.dir + "/val.json: data[0]: missing \"answers\"");
}

TEST(dataset_errors, a_bad_jsonl_line_is_named) {
    fixture_copy      c("generated");
    const std::string path = c.dir + "/items.jsonl";
    auto              load = [&] { return error_of([&] { ecokv::load_dataset("generated", c.dir); }); };

    write_file(path, R"({"image": [], "question": "q", "answers": ["a"], "type": "t"})"
                     "\n{\"image\": [], \"question\": \"q\",\n");
    EXPECT_EQ(load().rfind(path + ":2: invalid JSON at column 31:", 0), 0u) << load();

    write_file(path, "{\"image\": [], \"question\": \"q\", \"answers\": [\"a\"]}\n");
    EXPECT_EQ(load(), path + ":1: missing \"type\"");

    write_file(path, "[1, 2]\n");
    EXPECT_EQ(load(), path + ":1: expected a JSON object, not array");

    write_file(path, R"({"id": "x", "image": [], "question": "q", "answers": ["a"], "type": "t"})"
                     "\n\n"
                     R"({"id": "x", "image": [], "question": "q", "answers": ["b"], "type": "t"})");
    EXPECT_EQ(load(), path + ":3: duplicate id 'x' (first on line 1)");

    write_file(path, R"({"image": ["../secret.png"], "question": "q", "answers": ["a"], "type": "t"})");
    EXPECT_EQ(load(), path + ":1: image path '../secret.png' must be relative to the dataset directory");

    write_file(path, R"({"image": ["/etc/passwd"], "question": "q", "answers": ["a"], "type": "t"})");
    EXPECT_EQ(load(), path + ":1: image path '/etc/passwd' must be relative to the dataset directory");
}

TEST(dataset_errors, missing_images_are_counted_and_the_first_is_named) {
    fixture_copy c("mpdocvqa");
    fs::remove(c.dir + "/images/pybv0228_p81.jpg");
    fs::remove(c.dir + "/images/xnbl0037_p0.jpg");
    EXPECT_EQ(error_of([&] { ecokv::load_dataset("mpdocvqa", c.dir); }),
              "mpdocvqa: 2 of 4 images missing; first: " + c.dir + "/images/pybv0228_p81.jpg (item '49153')");

    fixture_copy o("ocrbench");
    fs::remove_all(o.dir + "/OCRBench_Images");
    EXPECT_EQ(error_of([&] { ecokv::load_dataset("ocrbench", o.dir); }),
              "ocrbench: 3 of 3 images missing; first: " + o.dir +
                  "/OCRBench_Images/IIIT5K/test/137_3.png (item 'IIIT5K/211')");
}

TEST(dataset_errors, milebench_entries_are_checked) {
    fixture_copy      c("milebench");
    const std::string path = c.dir + "/WebQA/WebQA.json";
    auto              load = [&] { return error_of([&] { ecokv::load_dataset("milebench", c.dir); }); };
    auto              with = [&](const std::string & entry) {
        write_file(path, R"({"meta_data": {"task_instruction": ["i0", "i1"]}, "data": [)" + entry + "]}");
    };
    with(R"({"sample_id": 0, "task_instruction_id": 2, "task_instance": {"context": "c", "images_path": []},
             "response": "r"})");
    EXPECT_EQ(load(), path + ": data[0]: \"task_instruction_id\" must index meta_data.task_instruction "
                             "(2 instructions), not 2");
    with(R"({"sample_id": 0, "task_instruction_id": 0, "task_instance": {"context": "{image#1}{image#1}",
             "images_path": ["0.jpg"]}, "response": "r"})");
    EXPECT_EQ(load(), path + ": data[0].task_instance: the context has 2 image placeholders for 1 images");
    with(R"({"sample_id": 0, "task_instruction_id": 0, "task_instance": {"images_path": []}, "response": "r"})");
    EXPECT_EQ(load(), path + ": data[0].task_instance: missing \"context\"");
    write_file(path, R"({"data": []})");
    EXPECT_EQ(load(), path + ": missing \"meta_data\"");
}

// ---------------------------------------------------------------------------------------------------------------
// niah

// The haystack without the needle, and the words before the needle.
struct needle_split {
    size_t words_before = 0, words_total = 0;
    bool   found        = false;
};

needle_split split_needle(const eval_item & it) {
    static const std::regex re("The special magic number for ([a-z]+-[a-z]+) is ([0-9]{7})\\.");
    std::smatch             m;
    needle_split            s;
    if (!std::regex_search(it.context, m, re)) {
        return s;
    }
    s.found        = true;
    s.words_before = words(m.prefix().str());
    s.words_total  = s.words_before + words(m.suffix().str());
    EXPECT_EQ(it.question, "What is the special magic number for " + m[1].str() + "?");
    EXPECT_EQ(it.answers, strings{ m[2].str() });
    return s;
}

TEST(dataset_niah, the_same_params_give_the_same_items) {
    ecokv::niah_params p;
    const auto         a = ecokv::make_niah(p);
    const auto         b = ecokv::make_niah(p);
    ASSERT_EQ(a.size(), 20u);
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].id, "niah-" + std::to_string(i));
        EXPECT_EQ(a[i].context, b[i].context);
        EXPECT_EQ(a[i].question, b[i].question);
        EXPECT_EQ(a[i].answers, b[i].answers);
        EXPECT_EQ(a[i].type, b[i].type);
        EXPECT_TRUE(a[i].images.empty());
    }
    p.seed       = 43;
    const auto c = ecokv::make_niah(p);
    size_t     n_same = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        n_same += a[i].context == c[i].context;
    }
    EXPECT_EQ(n_same, 0u);
    // An item does not depend on how many are made.
    p.seed  = 42;
    p.count = 3;
    EXPECT_EQ(ecokv::make_niah(p)[2].context, a[2].context);
}

TEST(dataset_niah, the_needle_sits_at_the_requested_depth_and_length) {
    ecokv::niah_params p;
    p.count         = 40;
    p.context_words = 400;
    p.n_lengths     = 4;
    p.n_depths      = 5;
    const auto items = ecokv::make_niah(p);
    std::set<std::string> answers;
    for (size_t i = 0; i < items.size(); ++i) {
        const eval_item &  it    = items[i];
        const needle_split s     = split_needle(it);
        const size_t       level = 100 * ((i / 5) % 4 + 1);  // words of the length level
        const int          depth = int(i % 5) * 25;          // percent
        ASSERT_TRUE(s.found) << it.context;
        EXPECT_EQ(count_of(it.context, "special magic number"), 1u);
        EXPECT_EQ(it.type, "words=" + std::to_string(level) + " depth=" + std::to_string(depth) + "%");
        // Whole filler sentences (at most 11 words each) up to the level.
        EXPECT_LE(s.words_total, level) << it.type;
        EXPECT_GT(s.words_total, level - 11) << it.type;
        // The nearest sentence boundary: within half a sentence of the requested depth.
        EXPECT_NEAR(double(s.words_before), depth / 100.0 * double(s.words_total), 6.0) << it.type;
        if (depth == 0) {
            EXPECT_EQ(it.context.rfind("The special magic number", 0), 0u);
        }
        if (depth == 100) {
            EXPECT_EQ(s.words_before, s.words_total);
            EXPECT_EQ(it.context.back(), '.');
        }
        EXPECT_EQ(it.answers[0].size(), 7u);
        answers.insert(it.answers[0]);
    }
    EXPECT_GT(answers.size(), 35u);  // drawn numbers, not a constant
}

TEST(dataset_niah, one_depth_level_is_the_middle) {
    ecokv::niah_params p;
    p.count    = 3;
    p.n_depths = 1;
    for (const eval_item & it : ecokv::make_niah(p)) {
        const needle_split s = split_needle(it);
        EXPECT_TRUE(contains(it.type, " depth=50%"));
        EXPECT_NEAR(double(s.words_before), 0.5 * double(s.words_total), 6.0);
    }
}

TEST(dataset_niah, load_dataset_uses_the_defaults_or_niah_json) {
    const auto defaults = ecokv::make_niah({});
    const auto loaded   = ecokv::load_dataset("niah", "");
    ASSERT_EQ(loaded.size(), defaults.size());
    EXPECT_EQ(loaded[5].context, defaults[5].context);
    temp_dir tmp;  // a directory without niah.json: the defaults too
    EXPECT_EQ(ecokv::load_dataset("niah", tmp.path().string())[5].context, defaults[5].context);

    // tests/data/datasets/niah/niah.json: seed 7, 6 items, 40 words, 2 lengths, 3 depths, haystack.txt.
    const auto items = load("niah");
    ASSERT_EQ(items.size(), 6u);
    ecokv::niah_params p;
    p.seed          = 7;
    p.count         = 6;
    p.context_words = 40;
    p.n_lengths     = 2;
    p.n_depths      = 3;
    p.haystack_file = fixture("niah/haystack.txt");
    const auto want = ecokv::make_niah(p);
    for (size_t i = 0; i < items.size(); ++i) {
        EXPECT_EQ(items[i].context, want[i].context);
        EXPECT_TRUE(split_needle(items[i]).found);
    }
    EXPECT_EQ(items[0].type, "words=20 depth=0%");
    EXPECT_EQ(items[5].type, "words=40 depth=100%");
}

TEST(dataset_niah, a_haystack_file_gives_its_sentences) {
    temp_dir tmp;
    ecokv::niah_params p;
    p.haystack_file = tmp.write("h.txt", "Alpha beta gamma.\n  Delta  epsilon!\n\"Zeta eta?\" Theta iota kappa.");
    p.count         = 8;
    p.context_words = 9;
    p.n_lengths     = 1;
    p.n_depths      = 2;
    const std::vector<std::string> sentences = { "Alpha beta gamma.", "Delta epsilon!", "\"Zeta eta?\"",
                                                 "Theta iota kappa." };
    for (const eval_item & it : ecokv::make_niah(p)) {
        const needle_split s = split_needle(it);
        ASSERT_TRUE(s.found);
        EXPECT_LE(s.words_total, 9u);
        EXPECT_GE(s.words_total, 7u);  // 3 whole sentences of 2-3 words
        // Consecutive sentences of the file, cyclically, whitespace collapsed.
        static const std::regex needle(" ?The special magic number for \\S+ is \\d+\\.");
        std::string             rest = std::regex_replace(it.context, needle, "");
        rest                         = std::regex_replace(rest, std::regex("^ "), "");
        bool cyclic      = false;
        for (size_t start = 0; start < sentences.size(); ++start) {
            std::string want;
            for (size_t k = 0; k < 3; ++k) {
                want += (k ? " " : "") + sentences[(start + k) % sentences.size()];
            }
            cyclic |= rest == want;
        }
        EXPECT_TRUE(cyclic) << rest;
    }
    p.haystack_file = tmp / "none.txt";
    EXPECT_EQ(error_of([&] { ecokv::make_niah(p); }), tmp / "none.txt: cannot open the niah haystack file");
    p.haystack_file = tmp.write("empty.txt", " \n");
    EXPECT_EQ(error_of([&] { ecokv::make_niah(p); }), tmp / "empty.txt: the niah haystack file has no text");
}

TEST(dataset_niah, bad_params_name_the_option) {
    ecokv::niah_params p;
    p.count = 0;
    EXPECT_EQ(error_of([&] { ecokv::make_niah(p); }), "niah: count 0 must be at least 1");
    p                 = {};
    p.context_words   = 3;
    p.n_lengths       = 4;
    EXPECT_EQ(error_of([&] { ecokv::make_niah(p); }), "niah: n_lengths 4 must not exceed context_words 3");
    p          = {};
    p.n_depths = -1;
    EXPECT_EQ(error_of([&] { ecokv::make_niah(p); }), "niah: n_depths -1 must be at least 1");

    temp_dir          tmp;
    const std::string cfg = tmp / "niah.json";
    auto              load = [&] { return error_of([&] { ecokv::load_dataset("niah", tmp.path().string()); }); };
    write_file(cfg, R"({"count": 0})");
    EXPECT_EQ(load(), cfg + ": niah: count 0 must be at least 1");
    write_file(cfg, R"({"depths": 3})");
    EXPECT_EQ(load(), cfg + ": \"depths\": unknown key; known: seed, count, context_words, n_lengths, n_depths, "
                            "haystack_file");
    write_file(cfg, R"({"count": "3"})");
    EXPECT_EQ(load(), cfg + ": \"count\" must be an integer, not \"3\"");
    write_file(cfg, R"({"seed": -1})");
    EXPECT_EQ(load(), cfg + ": \"seed\" must not be negative");
    write_file(cfg, R"({"count": 3000000000})");
    EXPECT_EQ(load(), cfg + ": \"count\" 3000000000 is out of range");
    write_file(cfg, R"([1])");
    EXPECT_EQ(load(), cfg + ": expected an object of niah parameters, not array");
}

// Generation is bounded before anything is made, the haystack file is confined to the dataset directory like image
// paths, and a number beyond a double names its file and line.
TEST(dataset_niah, sizes_paths_and_numbers_are_bounded) {
    ecokv::niah_params p;
    p.count = 2147483647;
    EXPECT_EQ(error_of([&] { ecokv::make_niah(p); }), "niah: count 2147483647 must be at most 100000");
    p               = {};
    p.context_words = 1000001;
    EXPECT_EQ(error_of([&] { ecokv::make_niah(p); }), "niah: context_words 1000001 must be at most 1000000");
    p               = {};
    p.count         = 100;
    p.context_words = 600000;
    EXPECT_EQ(error_of([&] { ecokv::make_niah(p); }),
              "niah: count x context_words 60000000 must be at most 50000000");

    temp_dir          tmp;
    const std::string cfg  = tmp / "niah.json";
    auto              load = [&] { return error_of([&] { ecokv::load_dataset("niah", tmp.path().string()); }); };
    for (const char * path : { "/etc/hostname", "../haystack.txt" }) {
        write_file(cfg, std::string(R"({"haystack_file": ")") + path + "\"}");
        EXPECT_EQ(load(), cfg + ": \"haystack_file\": path '" + path + "' must be relative to the dataset directory");
    }
    write_file(cfg, "{\n  \"count\": 1e309\n}");
    EXPECT_EQ(load(), cfg + ":2: number 1e309 is out of range (beyond a double)");
}

}  // namespace
