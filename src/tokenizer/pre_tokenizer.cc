#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "tokenizer/regex.h"
#include "util/error.h"

namespace dflash {
namespace {

// GPT-2's pattern, used by ByteLevel when use_regex is true.
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class SplitPre : public PreTokenizer {
 public:
  SplitPre(const std::string& pattern, bool literal, Behavior behavior, bool invert,
           const std::string& where)
      : regex_(pattern, literal, where), behavior_(behavior), invert_(invert) {}

  void split(std::vector<std::string_view>& pieces, std::deque<std::string>&) const override {
    std::vector<std::string_view> out;
    out.reserve(pieces.size() * 4);
    std::vector<std::pair<size_t, size_t>> matches;
    struct Span {
      size_t s, e;
      bool match;
    };
    std::vector<Span> spans;
    for (std::string_view piece : pieces) {
      matches.clear();
      regex_.find_all(piece, matches);
      spans.clear();
      size_t prev = 0;
      for (auto [s, e] : matches) {
        if (s > prev) spans.push_back({prev, s, invert_});
        spans.push_back({s, e, !invert_});
        prev = e;
      }
      if (prev < piece.size()) spans.push_back({prev, piece.size(), invert_});
      emit(piece, spans, out);
    }
    pieces.swap(out);
  }

 private:
  template <typename Spans>
  void emit(std::string_view piece, const Spans& spans, std::vector<std::string_view>& out) const {
    auto push = [&](size_t s, size_t e) {
      if (e > s) out.push_back(piece.substr(s, e - s));
    };
    switch (behavior_) {
      case Behavior::kIsolated:
        for (const auto& sp : spans) push(sp.s, sp.e);
        break;
      case Behavior::kRemoved:
        for (const auto& sp : spans)
          if (!sp.match) push(sp.s, sp.e);
        break;
      case Behavior::kMergedWithPrevious: {
        // A delimiter joins the piece before it.
        size_t start = 0;
        bool open = false;
        for (const auto& sp : spans) {
          if (sp.match) {
            push(open ? start : sp.s, sp.e);
            open = false;
          } else {
            if (open) push(start, sp.s);
            start = sp.s;
            open = true;
          }
        }
        if (open) push(start, piece.size());
        break;
      }
      case Behavior::kMergedWithNext: {
        // A delimiter joins the piece after it.
        size_t start = 0;
        bool open = false;
        for (const auto& sp : spans) {
          if (sp.match) {
            if (open) push(start, sp.s);
            start = sp.s;
            open = true;
          } else {
            push(open ? start : sp.s, sp.e);
            open = false;
          }
        }
        if (open) push(start, piece.size());
        break;
      }
      case Behavior::kContiguous: {
        // Adjacent delimiters form one piece.
        size_t start = 0;
        bool have = false, last_match = false;
        for (const auto& sp : spans) {
          if (have && sp.match && last_match) continue;
          if (have) push(start, sp.s);
          start = sp.s;
          have = true;
          last_match = sp.match;
        }
        if (have) push(start, piece.size());
        break;
      }
    }
  }

  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<SplitPre>(kGpt2Pattern, false, Behavior::kIsolated,
                                                       false, where);
  }
  void split(std::vector<std::string_view>& pieces, std::deque<std::string>& arena) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces) {
        if (!p.empty() && p[0] == ' ') continue;
        std::string& spaced = arena.emplace_back();
        spaced.reserve(p.size() + 1);
        spaced += ' ';
        spaced += p;
        p = arena.back();
      }
    }
    if (regex_) regex_->split(pieces, arena);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitPre> regex_;
};

class SequencePre : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  void split(std::vector<std::string_view>& pieces, std::deque<std::string>& arena) const override {
    for (const auto& s : steps) s->split(pieces, arena);
  }
};

Behavior parse_behavior(const nlohmann::json& v, const std::string& where) {
  const std::string b = v.is_string() ? v.get<std::string>() : "";
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  throw Error(where + ".behavior: unsupported split behavior '" + b + "'");
}

}  // namespace

std::unique_ptr<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& config,
                                                      const std::string& where) {
  if (config.is_null()) return nullptr;
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    throw Error(where + ": expected an object with a \"type\"");
  const std::string type = config["type"].get<std::string>();
  if (type == "Split") {
    const auto& pat = config.contains("pattern") ? config["pattern"] : nlohmann::json();
    bool literal;
    std::string pattern;
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      literal = false;
      pattern = pat["Regex"].get<std::string>();
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      literal = true;
      pattern = pat["String"].get<std::string>();
    } else {
      throw Error(where + ".pattern: expected {\"Regex\": ...} or {\"String\": ...}");
    }
    const Behavior behavior =
        parse_behavior(config.contains("behavior") ? config["behavior"] : nlohmann::json(), where);
    return std::make_unique<SplitPre>(pattern, literal, behavior, config.value("invert", false),
                                      where + ".pattern");
  }
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPre>(config.value("add_prefix_space", false),
                                          config.value("use_regex", true), where);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequencePre>();
    const auto& list = config.contains("pretokenizers") ? config["pretokenizers"] : nlohmann::json();
    if (!list.is_array()) throw Error(where + ".pretokenizers: expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = from_json(list[i], where + ".pretokenizers[" + std::to_string(i) + "]");
      if (p) seq->steps.push_back(std::move(p));
    }
    return seq;
  }
  throw Error(where + ".type: unsupported pre_tokenizer '" + type + "'");
}

}  // namespace dflash
