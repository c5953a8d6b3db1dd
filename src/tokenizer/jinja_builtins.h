#pragma once
// Filters, tests, global functions and str/list/dict methods available to templates.
#include <optional>
#include <string>

#include "tokenizer/jinja_value.h"

namespace dflash::jinja {

Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
bool apply_test(const std::string& name, const Value& input, CallArgs& args);
// Nullopt when `name` is not a method of `self`'s type.
std::optional<Value> call_method(const Value& self, const std::string& name, CallArgs& args);
Object make_globals();
// Python-style negative-index and slice helpers shared with the evaluator.
Value get_item(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
size_t length(const Value& v);

}  // namespace dflash::jinja
