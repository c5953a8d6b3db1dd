#pragma once
// dflash::Tokenizer: Hugging Face byte-level BPE tokenizers (tokenizer.json) plus the
// tokenizer_config.json settings (special token strings, chat template), producing the same
// ids and text as the HF `tokenizers` library and the same prompts as transformers' jinja2.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dflash {

struct EncodeOptions {
  // Recognize special added tokens (e.g. "<|im_end|>") in the text. When false they are
  // tokenized as plain text (HF's encode_special_tokens=True); non-special added tokens such
  // as Qwen's "<think>" are still recognized, as in HF.
  bool parse_special = true;
  // Apply the post-processor (Llama 3.1 prepends <|begin_of_text|>). Prompts rendered from a
  // chat template already contain their special tokens: encode them with this off.
  bool add_special_tokens = true;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // Passed to the template as `enable_thinking` when set; left undefined otherwise.
  std::optional<bool> enable_thinking;
  // Further variables for the template (e.g. {"tools": [...]}); must be an object or null.
  // ordered_json keeps key order, which tojson output depends on (as in Python dicts).
  const nlohmann::ordered_json* extra = nullptr;
};

class Tokenizer {
 public:
  // Loads dir/tokenizer.json and, if present, dir/tokenizer_config.json.
  static Tokenizer from_dir(const std::filesystem::path& dir);
  // `config_path` may be empty (no chat template, no bos/eos strings).
  static Tokenizer from_files(const std::filesystem::path& tokenizer_json,
                              const std::filesystem::path& config_path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Throws dflash::Error if `text` is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Unknown ids are skipped; invalid UTF-8 across tokens becomes U+FFFD (HF's lossy decode).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The raw bytes id stands for (may be part of a UTF-8 sequence); empty for unknown ids.
  const std::string& token_bytes(int32_t id) const;
  // The token string as written in tokenizer.json, or nullopt for unknown ids.
  std::optional<std::string> id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  // One past the largest id (model vocab and added tokens).
  size_t vocab_size() const;

  // From tokenizer_config.json; nullopt when absent or not in the vocab.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  const std::string& bos_token() const;  // empty when absent
  const std::string& eos_token() const;
  bool add_bos_token() const;  // tokenizer_config's add_bos_token (false when absent)

  const std::string& chat_template() const;  // empty when absent
  // Renders the chat template for `messages` (a JSON array of {"role","content",...}), the
  // way transformers' apply_chat_template(..., tokenize=False) does. Encode the result with
  // add_special_tokens=false. Throws dflash::Error on template errors.
  std::string apply_chat_template(const nlohmann::ordered_json& messages,
                                  const ChatOptions& options = {}) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: feed ids one at a time, get text that is always valid UTF-8. Bytes
// of an incomplete character are held back until the next token completes them; flush()
// ends the stream the way HF's lossy decode would. The concatenation of all outputs equals
// Tokenizer::decode of all ids.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);
  std::string flush();
  void reset() { pending_.clear(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dflash
