#include "tokenizer/post_processor.h"

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace dflash {

void PostProcessor::load(const nlohmann::json& config, const std::string& where) {
  if (config.is_null()) return;
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    throw Error(where + ": expected an object with a \"type\"");
  const std::string type = config["type"].get<std::string>();
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const auto& list = config.contains("processors") ? config["processors"] : nlohmann::json();
    if (!list.is_array()) throw Error(where + ".processors: expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      // Each processor wraps the result of the previous one.
      PostProcessor inner;
      inner.load(list[i], where + ".processors[" + std::to_string(i) + "]");
      prefix.insert(prefix.begin(), inner.prefix.begin(), inner.prefix.end());
      suffix.insert(suffix.end(), inner.suffix.begin(), inner.suffix.end());
    }
    return;
  }
  if (type != "TemplateProcessing") throw Error(where + ".type: unsupported post_processor '" + type + "'");
  const auto& single = config.contains("single") ? config["single"] : nlohmann::json();
  const auto& specials =
      config.contains("special_tokens") ? config["special_tokens"] : nlohmann::json::object();
  if (!single.is_array()) throw Error(where + ".single: expected an array");
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const auto& item = single[i];
    const std::string at = where + ".single[" + std::to_string(i) + "]";
    if (item.contains("Sequence")) {
      if (seen_sequence) throw Error(at + ": sequence appears twice");
      seen_sequence = true;
    } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
        throw Error(at + ": special token '" + name + "' missing from special_tokens");
      auto& dst = seen_sequence ? suffix : prefix;
      for (const auto& id : specials[name]["ids"]) dst.push_back(id.get<int32_t>());
    } else {
      throw Error(at + ": expected SpecialToken or Sequence");
    }
  }
  if (!seen_sequence) throw Error(where + ".single: no Sequence item");
}

}  // namespace dflash
