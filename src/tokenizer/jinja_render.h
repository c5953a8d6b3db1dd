#pragma once
// Evaluates a parsed template against a set of variables.
#include <string>

#include "tokenizer/jinja_ast.h"

namespace dflash::jinja {

std::string render(const Node& root, const Object& globals, const std::string& where);

}  // namespace dflash::jinja
