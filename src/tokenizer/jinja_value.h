#pragma once
// Values of the Jinja interpreter, with Python semantics where templates observe them:
// truthiness, str(), repr(), ==, ordering, and json.dumps as transformers' tojson calls it.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

namespace dflash::jinja {

struct Value;
using Array = std::vector<Value>;
// Insertion-ordered, like a Python dict.
using Object = std::vector<std::pair<std::string, Value>>;
struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kFunction };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  // Shared, as Python objects are: namespace() attributes set in a loop stay visible.
  std::shared_ptr<Array> arr;
  std::shared_ptr<Object> obj;
  std::shared_ptr<Function> fn;
  bool is_namespace = false;
  std::string undefined_name;  // for error messages

  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value array(Array v = {});
  static Value object(Object v = {});
  static Value function(Function f);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  double as_double() const { return kind == Kind::kInt ? static_cast<double>(i) : f; }

  bool truthy() const;
  const Value* find(const std::string& key) const;  // object member or nullptr
  void set(const std::string& key, Value v);        // object member
  std::string str() const;                          // Python str()
  std::string repr() const;                         // Python repr()
  std::string type_name() const;
};

bool equals(const Value& a, const Value& b);
// Python ordering; throws dflash::Error for incomparable types.
int compare(const Value& a, const Value& b);
// json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none).
std::string to_json(const Value& v, int indent = -1);
nlohmann::ordered_json to_nlohmann(const Value& v);

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // Positional argument `pos` or keyword `name`, or `fallback`.
  Value get(size_t pos, const char* name, Value fallback = Value::undefined()) const;
};

// Python's str.isspace for one code point (used by strip/split/trim).
bool is_py_space(char32_t c);
std::vector<char32_t> to_u32(const std::string& s);
std::string from_u32(const std::vector<char32_t>& s, size_t begin, size_t end);

}  // namespace dflash::jinja
