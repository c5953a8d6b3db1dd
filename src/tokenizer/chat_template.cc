#include "tokenizer/chat_template.h"
#include <nlohmann/json.hpp>
#include "util/error.h"
namespace dflash {
namespace jinja { struct Node {}; }
ChatTemplate::ChatTemplate(const std::string&, const std::string& where) : where_(where) {}
ChatTemplate::~ChatTemplate() = default;
std::string ChatTemplate::render(const nlohmann::json&) const { throw Error("todo"); }
}
