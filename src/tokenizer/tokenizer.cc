#include "tokenizer/tokenizer.h"

#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace dflash {

struct Tokenizer::Impl {
  BpeModel model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  PostProcessor post;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  std::vector<std::string> added_bytes;  // decode bytes per entry of `added`
  AddedTokenMatcher raw_matcher, normalized_matcher;
  size_t vocab_size = 0;

  std::string bos_token, eos_token, pad_token, chat_template;
  bool add_bos_token = false;
  std::unique_ptr<ChatTemplate> compiled_template;

  void encode_text(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;
  void encode_pieces(std::string_view text, std::vector<int32_t>& out) const;
};

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path.string() + ": invalid JSON: " + e.what());
  }
}

// Runs `load`, turning nlohmann's type and range errors (a field of the wrong type read with
// value() or get<>()) into an Error that names the file: the checks written out field by field
// cover what transformers writes, this covers the rest.
template <typename Load>
void naming_the_file(const std::string& file, const Load& load) {
  try {
    load();
  } catch (const nlohmann::json::exception& e) {
    throw Error(file + ": a field has the wrong type or value: " + e.what());
  }
}

const nlohmann::json& field(const nlohmann::json& obj, const char* name) {
  static const nlohmann::json null;
  auto it = obj.find(name);
  return it == obj.end() ? null : *it;
}

// Special token entries in tokenizer_config.json are a string or an AddedToken-like object.
std::string token_string(const nlohmann::json& cfg, const char* name, const std::string& file) {
  const auto& v = field(cfg, name);
  if (v.is_null()) return {};
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  throw Error(file + ": " + name + ": expected a string or {\"content\": ...}");
}

bool has_byte_level(const nlohmann::json& pre) {
  if (!pre.is_object()) return false;
  if (pre.value("type", "") == "ByteLevel") return true;
  if (pre.contains("pretokenizers") && pre["pretokenizers"].is_array())
    for (const auto& p : pre["pretokenizers"])
      if (has_byte_level(p)) return true;
  return false;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  const auto cfg = dir / "tokenizer_config.json";
  return from_files(dir / "tokenizer.json", std::filesystem::exists(cfg) ? cfg : std::filesystem::path());
}

Tokenizer Tokenizer::from_files(const std::filesystem::path& tokenizer_json,
                                const std::filesystem::path& config_path) {
  auto impl = std::make_unique<Impl>();
  const std::string file = tokenizer_json.string();
  const nlohmann::json tj = read_json(tokenizer_json);
  if (!tj.is_object()) throw Error(file + ": expected a JSON object");
  naming_the_file(file, [&] {
    impl->model.load(field(tj, "model"), file);
    if (!has_byte_level(field(tj, "pre_tokenizer")))
      throw Error(file + ": pre_tokenizer: only byte-level BPE (a ByteLevel pre-tokenizer) is supported");
    impl->normalizer = Normalizer::from_json(field(tj, "normalizer"), file + ": normalizer");
    impl->pre_tokenizer = PreTokenizer::from_json(field(tj, "pre_tokenizer"), file + ": pre_tokenizer");
    const auto& dec = field(tj, "decoder");
    if (!dec.is_null() && !(dec.is_object() && dec.value("type", "") == "ByteLevel"))
      throw Error(file + ": decoder.type: only the ByteLevel decoder is supported");
    impl->vocab_size = impl->model.size();

    const auto& added = field(tj, "added_tokens");
    if (!added.is_null() && !added.is_array()) throw Error(file + ": added_tokens: expected an array");
    for (size_t i = 0; added.is_array() && i < added.size(); ++i) {
      const auto& a = added[i];
      const std::string at = file + ": added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() > INT32_MAX)
        throw Error(at + ".id: expected a non-negative integer");
      if (!a.contains("content") || !a["content"].is_string()) throw Error(at + ".content: expected a string");
      AddedToken t;
      t.id = a["id"].get<int32_t>();
      t.content = a["content"].get<std::string>();
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      t.normalized = a.value("normalized", !t.special);
      impl->added_by_id[t.id] = impl->added.size();
      impl->added_by_content[t.content] = t.id;
      impl->added_bytes.push_back(byte_level::token_bytes(t.content));
      impl->vocab_size = std::max(impl->vocab_size, static_cast<size_t>(t.id) + 1);
      impl->added.push_back(std::move(t));
    }
    std::vector<const AddedToken*> raw, norm;
    std::vector<std::string> raw_pat, norm_pat;
    for (const auto& t : impl->added) {
      if (t.normalized && impl->normalizer) {
        norm.push_back(&t);
        norm_pat.push_back(impl->normalizer->normalize(t.content));
      } else {
        raw.push_back(&t);
        raw_pat.push_back(t.content);
      }
    }
    impl->raw_matcher.build(raw, raw_pat);
    impl->normalized_matcher.build(norm, norm_pat);
    impl->post.load(field(tj, "post_processor"), file + ": post_processor");
  });

  if (!config_path.empty()) {
    const std::string cfile = config_path.string();
    const nlohmann::json cfg = read_json(config_path);
    if (!cfg.is_object()) throw Error(cfile + ": expected a JSON object");
    naming_the_file(cfile, [&] {
      impl->bos_token = token_string(cfg, "bos_token", cfile);
      impl->eos_token = token_string(cfg, "eos_token", cfile);
      impl->pad_token = token_string(cfg, "pad_token", cfile);
      const auto& abt = field(cfg, "add_bos_token");
      if (!abt.is_null() && !abt.is_boolean()) throw Error(cfile + ": add_bos_token: expected a boolean");
      impl->add_bos_token = abt.is_boolean() && abt.get<bool>();
      const auto& ct = field(cfg, "chat_template");
      if (ct.is_string()) {
        impl->chat_template = ct.get<std::string>();
      } else if (ct.is_array()) {
        // Named templates: transformers uses "default" unless told otherwise.
        for (const auto& t : ct)
          if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
            impl->chat_template = t["template"].get<std::string>();
        if (impl->chat_template.empty()) throw Error(cfile + ": chat_template: no template named \"default\"");
      } else if (!ct.is_null()) {
        throw Error(cfile + ": chat_template: expected a string or a list of named templates");
      }
      if (!impl->chat_template.empty())
        impl->compiled_template = std::make_unique<ChatTemplate>(impl->chat_template, cfile + ": chat_template");
    });
  }
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_pieces(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::string_view> pieces{text};
  std::deque<std::string> arena;
  if (pre_tokenizer) pre_tokenizer->split(pieces, arena);
  for (std::string_view p : pieces) model.encode_word(p, out);
}

void Tokenizer::Impl::encode_text(std::string_view text, bool parse_special,
                                  std::vector<int32_t>& out) const {
  std::vector<Segment> segments;
  raw_matcher.split(text, parse_special, segments);
  std::vector<Segment> inner;
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    std::string_view piece = text.substr(s.begin, s.end - s.begin);
    std::string normalized;
    if (normalizer) {
      normalized = normalizer->normalize(piece);
      piece = normalized;
    }
    if (normalized_matcher.empty()) {
      encode_pieces(piece, out);
      continue;
    }
    inner.clear();
    normalized_matcher.split(piece, parse_special, inner);
    for (const Segment& t : inner) {
      if (t.id >= 0)
        out.push_back(t.id);
      else
        encode_pieces(piece.substr(t.begin, t.end - t.begin), out);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const size_t bad = utf8::first_invalid(text);
  if (bad != std::string_view::npos)
    throw Error("encode: input is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (options.add_special_tokens) out = impl_->post.prefix;
  impl_->encode_text(text, options.parse_special, out);
  if (options.add_special_tokens) out.insert(out.end(), impl_->post.suffix.begin(), impl_->post.suffix.end());
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added_bytes[it->second];
  return impl_->model.id_bytes(id);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return utf8::lossy(bytes);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  if (id < 0 || static_cast<size_t>(id) >= impl_->model.size() || impl_->model.id_token(id).empty())
    return std::nullopt;
  return impl_->model.id_token(id);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(std::string(token));
  if (it != impl_->added_by_content.end()) return it->second;
  const int32_t id = impl_->model.token_id(token);
  return id < 0 ? std::nullopt : std::optional<int32_t>(id);
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos_token.empty() ? std::nullopt : token_to_id(impl_->bos_token);
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos_token.empty() ? std::nullopt : token_to_id(impl_->eos_token);
}
std::optional<int32_t> Tokenizer::pad_id() const {
  return impl_->pad_token.empty() ? std::nullopt : token_to_id(impl_->pad_token);
}
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos_token; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

std::string Tokenizer::apply_chat_template(const nlohmann::ordered_json& messages,
                                           const ChatOptions& options) const {
  if (!impl_->compiled_template) throw Error("apply_chat_template: the tokenizer has no chat_template");
  if (!messages.is_array()) throw Error("apply_chat_template: messages must be a JSON array");
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  if (options.extra) {
    if (!options.extra->is_object() && !options.extra->is_null())
      throw Error("apply_chat_template: extra variables must be a JSON object");
    if (options.extra->is_object()) vars = *options.extra;
  }
  vars["messages"] = messages;
  vars["add_generation_prompt"] = options.add_generation_prompt;
  if (options.enable_thinking) vars["enable_thinking"] = *options.enable_thinking;
  // transformers passes the special token strings from tokenizer_config.json.
  if (!impl_->bos_token.empty()) vars["bos_token"] = impl_->bos_token;
  if (!impl_->eos_token.empty()) vars["eos_token"] = impl_->eos_token;
  if (!impl_->pad_token.empty()) vars["pad_token"] = impl_->pad_token;
  return impl_->compiled_template->render(vars);
}

}  // namespace dflash
