#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "util/error.h"

namespace dflash {
namespace {

class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(int options) : options_(options) {}
  std::string normalize(std::string_view text) const override {
    bool ascii = true;
    for (char c : text)
      if (static_cast<unsigned char>(c) >= 0x80) {
        ascii = false;
        break;
      }
    if (ascii) return std::string(text);  // every normal form leaves ASCII unchanged
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                     static_cast<utf8proc_ssize_t>(text.size()), &out,
                     static_cast<utf8proc_option_t>(options_));
    if (n < 0) throw Error(std::string("normalizer: ") + utf8proc_errmsg(n));
    std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
    return result;
  }

 private:
  int options_;
};

class Lowercase : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override {
    std::string out;
    out.reserve(text.size());
    utf8proc_ssize_t i = 0;
    const auto* s = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
    while (i < static_cast<utf8proc_ssize_t>(text.size())) {
      utf8proc_int32_t cp;
      const utf8proc_ssize_t n = utf8proc_iterate(s + i, text.size() - i, &cp);
      if (n <= 0) throw Error("normalizer: invalid UTF-8");
      utf8proc_uint8_t buf[4];
      const utf8proc_ssize_t m = utf8proc_encode_char(utf8proc_tolower(cp), buf);
      out.append(reinterpret_cast<char*>(buf), static_cast<size_t>(m));
      i += n;
    }
    return out;
  }
};

class SequenceNormalizer : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> steps;
  std::string normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& n : steps) s = n->normalize(s);
    return s;
  }
};

}  // namespace

std::unique_ptr<Normalizer> Normalizer::from_json(const nlohmann::json& config,
                                                  const std::string& where) {
  if (config.is_null()) return nullptr;
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    throw Error(where + ": expected an object with a \"type\"");
  const std::string type = config["type"].get<std::string>();
  const int stable = UTF8PROC_STABLE;
  if (type == "NFC") return std::make_unique<UnicodeForm>(stable | UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeForm>(stable | UTF8PROC_DECOMPOSE);
  if (type == "NFKC")
    return std::make_unique<UnicodeForm>(stable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD")
    return std::make_unique<UnicodeForm>(stable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceNormalizer>();
    const auto& list = config.contains("normalizers") ? config["normalizers"] : nlohmann::json();
    if (!list.is_array()) throw Error(where + ".normalizers: expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      auto n = from_json(list[i], where + ".normalizers[" + std::to_string(i) + "]");
      if (n) seq->steps.push_back(std::move(n));
    }
    return seq;
  }
  throw Error(where + ".type: unsupported normalizer '" + type + "'");
}

}  // namespace dflash
