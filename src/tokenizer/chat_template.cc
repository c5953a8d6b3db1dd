#include "tokenizer/chat_template.h"

#include <nlohmann/json.hpp>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_render.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace dflash {

namespace {
const std::string& checked(const std::string& source, const std::string& where) {
  const size_t bad = utf8::first_invalid(source);
  if (bad != std::string_view::npos)
    throw Error(where + ": template is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  return source;
}
}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, const std::string& where)
    : where_(where), root_(jinja::parse(checked(source, where), where)) {}

ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& vars) const {
  if (!vars.is_object()) throw Error(where_ + ": template variables must be a JSON object");
  jinja::Object globals = jinja::make_globals();
  for (const auto& [k, v] : vars.items()) globals.emplace_back(k, jinja::Value::from_json(v));
  return jinja::render(*root_, globals, where_);
}

}  // namespace dflash
