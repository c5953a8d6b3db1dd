// Loading, metadata and error handling of the public Tokenizer API.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fixtures.h"
#include "util/error.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

TEST(TokenizerApi, SpecialTokenMetadata) {
  const Tokenizer& qwen = testing::tokenizer("qwen3");
  EXPECT_EQ(qwen.eos_token(), "<|im_end|>");
  EXPECT_EQ(qwen.eos_id(), 151645);
  EXPECT_EQ(qwen.pad_id(), 151643);
  EXPECT_FALSE(qwen.bos_id().has_value());
  EXPECT_FALSE(qwen.add_bos_token());
  EXPECT_EQ(qwen.vocab_size(), 151669u);
  EXPECT_TRUE(qwen.is_special(151645));
  EXPECT_FALSE(qwen.is_special(*qwen.token_to_id("<think>")));
  EXPECT_EQ(qwen.id_to_token(9707), "Hello");
  EXPECT_FALSE(qwen.chat_template().empty());

  const Tokenizer& llama = testing::tokenizer("llama3.1");
  EXPECT_EQ(llama.bos_id(), 128000);
  EXPECT_EQ(llama.eos_id(), 128009);
  EXPECT_EQ(llama.vocab_size(), 128256u);
  EXPECT_EQ(llama.token_bytes(128000), "<|begin_of_text|>");
}

TEST(TokenizerApi, EncodeOptions) {
  const Tokenizer& llama = testing::tokenizer("llama3.1");
  const auto with_bos = llama.encode("hi <|eot_id|>");
  const auto without = llama.encode("hi <|eot_id|>", {.parse_special = true, .add_special_tokens = false});
  ASSERT_EQ(with_bos.size(), without.size() + 1);
  EXPECT_EQ(with_bos[0], 128000);
  EXPECT_EQ(without.back(), 128009);
  const auto plain = llama.encode("hi <|eot_id|>", {.parse_special = false, .add_special_tokens = false});
  EXPECT_GT(plain.size(), without.size());
  for (int32_t id : plain) EXPECT_LT(id, 128000);
  EXPECT_EQ(llama.decode(plain), "hi <|eot_id|>");
}

TEST(TokenizerApi, InvalidUtf8IsAnError) {
  const Tokenizer& tok = testing::tokenizer("qwen3");
  for (std::string bad : {std::string("abc\xFF"), std::string("\xC3"), std::string("\xED\xA0\x80"),
                          std::string("ok\xE2\x82")}) {
    try {
      tok.encode(bad);
      FAIL() << "no error for invalid UTF-8";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos);
    }
  }
}

class BadFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dflash_tok_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::string load_error() {
    try {
      Tokenizer::from_dir(dir_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

const char* const kMinimal = R"({
  "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": [MERGES]}
})";

std::string minimal(const std::string& merges) {
  std::string s = kMinimal;
  s.replace(s.find("MERGES"), 6, merges);
  return s;
}

TEST_F(BadFiles, MissingFile) { EXPECT_NE(load_error().find("tokenizer.json: cannot open"), std::string::npos); }

TEST_F(BadFiles, InvalidJson) {
  write("tokenizer.json", "{ nope");
  EXPECT_NE(load_error().find("tokenizer.json: invalid JSON"), std::string::npos);
}

TEST_F(BadFiles, MergeWithUnknownToken) {
  write("tokenizer.json", minimal(R"("a c")"));
  const std::string err = load_error();
  EXPECT_NE(err.find("model.merges[0]"), std::string::npos) << err;
  EXPECT_NE(err.find("\"c\""), std::string::npos) << err;
}

TEST_F(BadFiles, MalformedMerge) {
  write("tokenizer.json", minimal(R"(42)"));
  EXPECT_NE(load_error().find("model.merges[0]"), std::string::npos);
}

TEST_F(BadFiles, UnsupportedPreTokenizer) {
  std::string s = minimal(R"("a b")");
  s.replace(s.find("\"ByteLevel\", \"add"), 11, "\"Metaspace\"");
  write("tokenizer.json", s);
  EXPECT_NE(load_error().find("pre_tokenizer"), std::string::npos);
}

TEST_F(BadFiles, BadRegex) {
  std::string s = minimal(R"("a b")");
  const std::string pre = R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "use_regex": false}]})";
  const size_t b = s.find("{\"type\": \"ByteLevel\", \"add");
  s.replace(b, s.find('}', b) + 1 - b, pre);
  write("tokenizer.json", s);
  const std::string err = load_error();
  EXPECT_NE(err.find("pre_tokenizer.pretokenizers[0].pattern"), std::string::npos) << err;
}

TEST_F(BadFiles, BadConfigField) {
  write("tokenizer.json", minimal(R"(["a", "b"])"));
  write("tokenizer_config.json", R"({"add_bos_token": "yes"})");
  const std::string err = load_error();
  EXPECT_NE(err.find("tokenizer_config.json: add_bos_token"), std::string::npos) << err;
  write("tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  EXPECT_NE(load_error().find("tokenizer_config.json: chat_template"), std::string::npos);
}

// Fields read with nlohmann's value() or get<>() used to let a wrong type escape as its
// type_error, naming no file.
TEST_F(BadFiles, WrongTypedFieldsNameTheFile) {
  std::string s = minimal(R"(["a", "b"])");
  const std::string empty_added = R"("added_tokens": [])";
  s.replace(s.find(empty_added), empty_added.size(), R"("added_tokens": [{"id": 4, "content": "<x>", "special": "yes"}])");
  write("tokenizer.json", s);
  std::string err = load_error();
  EXPECT_NE(err.find("tokenizer.json: a field has the wrong type or value"), std::string::npos) << err;
  write("tokenizer.json", minimal(R"(["a", "b"])"));
  write("tokenizer_config.json", R"({"chat_template": [{"name": 7, "template": "x"}]})");
  err = load_error();
  EXPECT_NE(err.find("tokenizer_config.json: a field has the wrong type or value"), std::string::npos) << err;
}

TEST_F(BadFiles, MinimalTokenizerWorksWithPairMerges) {
  write("tokenizer.json", minimal(R"(["a", "b"])"));
  const Tokenizer tok = Tokenizer::from_dir(dir_);
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{2}));
  EXPECT_EQ(tok.encode("ba"), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(tok.decode(tok.encode("abba")), "abba");
  EXPECT_THROW(tok.apply_chat_template(nlohmann::ordered_json::array()), Error);  // no template
}

}  // namespace
}  // namespace dflash
