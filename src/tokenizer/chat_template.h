#pragma once
// Chat templates: a Jinja interpreter covering the subset HF chat templates use, configured
// like transformers' environment (trim_blocks, lstrip_blocks, loop controls, raise_exception,
// a Python-style tojson), so rendering is byte-identical to jinja2.
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace dflash {

namespace jinja {
struct Node;
}

class ChatTemplate {
 public:
  // Parses once; throws dflash::Error naming `where` on syntax errors.
  ChatTemplate(const std::string& source, const std::string& where);
  ~ChatTemplate();
  // `vars` is a JSON object of template variables (messages, add_generation_prompt, ...).
  std::string render(const nlohmann::ordered_json& vars) const;

 private:
  std::string where_;
  std::shared_ptr<jinja::Node> root_;
};

}  // namespace dflash
