// libFuzzer target over loading a tokenizer from its files: Tokenizer::from_files on a
// tokenizer.json (first byte, bit 0 clear) or on the test byte tokenizer with a
// tokenizer_config.json (bit 0 set). The file is the input's bytes (bit 1 set) or the test byte
// tokenizer's own file with the input's edits (json_edits.h), which reach the field checks that
// raw bytes rarely do. Any file must either load into a tokenizer that encodes, decodes and
// renders its chat template without crashing, or fail with a dflash::Error that names the file;
// nothing else may escape, and nothing may crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_checks.h"
#include "json_edits.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

namespace fs = std::filesystem;
using dflash::fuzz::check;

const fs::path& scratch() {
  static const fs::path dir = [] {
    char tmpl[] = "/tmp/fuzz_tokenizer_files.XXXXXX";
    check(mkdtemp(tmpl) != nullptr, "mkdtemp");
    return fs::path(tmpl);
  }();
  return dir;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(text.data(), std::streamsize(text.size()));
}

void fuzz_files(bool config_mode, const std::string& text) {
  const fs::path byte_tokenizer = fs::path(DFLASH_SOURCE_DIR) / "testdata/server/byte-tokenizer/tokenizer.json";
  const fs::path tj = config_mode ? byte_tokenizer : scratch() / "tokenizer.json";
  const fs::path cfg = scratch() / "tokenizer_config.json";
  write(config_mode ? cfg : tj, text);
  const std::string named = config_mode ? "tokenizer_config.json" : "tokenizer.json";
  try {
    const dflash::Tokenizer tok = dflash::Tokenizer::from_files(tj, config_mode ? cfg : fs::path());
    // Loaded: the ordinary calls must work or refuse cleanly.
    try {
      const auto ids = tok.encode("def f(x):\n    return x <|endoftext|> é");
      (void)tok.decode(ids);
    } catch (const dflash::Error&) {
      // a tokenizer may lack what a text needs (no byte fallback), and say so
    }
    if (!tok.chat_template().empty()) {
      nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
      msgs.push_back({{"role", "user"}, {"content", "hi"}});
      try {
        (void)tok.apply_chat_template(msgs);
      } catch (const dflash::Error&) {
        // templates raise on conversations they do not accept
      }
    }
  } catch (const dflash::Error& e) {
    const std::string m = e.what();
    check(!m.empty(), "empty error message");
    check(m.find(named) != std::string::npos, "error does not name the file");
  }
}

// The fields of each file, for the edits of json_edits.h.
const std::vector<std::string> kTokenizerFields = {
    "/model", "/model/type", "/model/vocab", "/model/vocab/a", "/model/merges", "/model/merges/0",
    "/model/dropout", "/model/ignore_merges", "/model/byte_fallback", "/model/continuing_subword_prefix",
    "/added_tokens", "/added_tokens/0", "/added_tokens/0/id", "/added_tokens/0/content", "/added_tokens/0/special",
    "/added_tokens/0/normalized", "/added_tokens/0/lstrip", "/added_tokens/0/single_word", "/normalizer",
    "/normalizer/type", "/pre_tokenizer", "/pre_tokenizer/type", "/pre_tokenizer/use_regex",
    "/pre_tokenizer/add_prefix_space", "/decoder", "/decoder/type", "/post_processor"};
const std::vector<std::string> kConfigFields = {
    "/add_bos_token", "/bos_token", "/eos_token", "/pad_token", "/chat_template", "/chat_template/0",
    "/chat_template/0/name", "/chat_template/0/template", "/eos_token/content", "/model_max_length"};

nlohmann::json read_source_json(const char* rel) {
  std::ifstream in(fs::path(DFLASH_SOURCE_DIR) / rel, std::ios::binary);
  return nlohmann::json::parse(in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool config_mode = data[0] & 1;
  if (data[0] & 2) {
    fuzz_files(config_mode, std::string(reinterpret_cast<const char*>(data + 1), size - 1));
    return 0;
  }
  static const nlohmann::json tokenizer_json = read_source_json("testdata/server/byte-tokenizer/tokenizer.json");
  static const nlohmann::json config_json = read_source_json("testdata/server/byte-tokenizer/tokenizer_config.json");
  nlohmann::json doc = config_mode ? config_json : tokenizer_json;
  dflash::fuzz::apply_json_edits(doc, config_mode ? kConfigFields : kTokenizerFields, data + 1, size - 1);
  fuzz_files(config_mode, doc.dump());
  return 0;
}
