// libFuzzer target over the tokenizer: encode (any bytes; invalid UTF-8 must be a clean
// dflash::Error), decode and the streaming decoder (any ids), and the chat template parser
// and renderer (any template source). The first byte picks the mode.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_checks.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace {

using dflash::fuzz::check;

const dflash::Tokenizer& tokenizer() {
  static const dflash::Tokenizer tok =
      dflash::Tokenizer::from_dir(DFLASH_TOKENIZER_DATA "/llama3.1");
  return tok;
}

void fuzz_encode(const std::string& text) {
  const auto& tok = tokenizer();
  for (bool special : {true, false}) {
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(text, {.parse_special = special, .add_special_tokens = false});
    } catch (const dflash::Error&) {
      check(dflash::utf8::first_invalid(text) != std::string_view::npos, "encode rejected valid UTF-8");
      return;
    }
    // Llama 3.1 has no normalizer, so every valid input must round-trip exactly.
    check(tok.decode(ids) == text, "decode(encode(x)) != x");
  }
}

void fuzz_decode(const uint8_t* data, size_t size) {
  const auto& tok = tokenizer();
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 3 <= size; i += 3)
    ids.push_back(static_cast<int32_t>((data[i] << 16 | data[i + 1] << 8 | data[i + 2]) % 130000));
  const std::string full = tok.decode(ids);
  check(dflash::utf8::first_invalid(full) == std::string_view::npos, "decode produced invalid UTF-8");
  dflash::IncrementalDecoder dec(tok);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = dec.push(id);
    check(dflash::utf8::first_invalid(piece) == std::string_view::npos, "stream produced invalid UTF-8");
    streamed += piece;
  }
  streamed += dec.flush();
  check(streamed == full, "incremental decode != decode");
}

void fuzz_template(const std::string& source) {
  try {
    dflash::ChatTemplate tmpl(source, "fuzz");
    nlohmann::ordered_json vars = {
        {"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}}},
        {"add_generation_prompt", true},
        {"bos_token", "<s>"}};
    tmpl.render(vars);
  } catch (const dflash::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: fuzz_encode(rest); break;
    case 1: fuzz_decode(data + 1, size - 1); break;
    default: fuzz_template(rest); break;
  }
  return 0;
}
