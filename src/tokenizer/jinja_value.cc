#include "tokenizer/jinja_value.h"

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace dflash::jinja {

Value Value::undefined(std::string name) {
  Value v;
  v.undefined_name = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
Value Value::array(Array x) {
  Value v;
  v.kind = Kind::kArray;
  v.arr = std::make_shared<Array>(std::move(x));
  return v;
}
Value Value::object(Object x) {
  Value v;
  v.kind = Kind::kObject;
  v.obj = std::make_shared<Object>(std::move(x));
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind = Kind::kFunction;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(from_json(e));
      return array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (const auto& [k, e] : j.items()) o.emplace_back(k, from_json(e));
      return object(std::move(o));
    }
    default: throw Error("chat template: unsupported JSON value");
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined: case Kind::kNone: return false;
    case Kind::kBool: return b;
    case Kind::kInt: return i != 0;
    case Kind::kFloat: return f != 0;
    case Kind::kString: return !s.empty();
    case Kind::kArray: return !arr->empty();
    case Kind::kObject: return !obj->empty();
    case Kind::kFunction: return true;
  }
  return false;
}

const Value* Value::find(const std::string& key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& [k, v] : *obj)
    if (k == key) return &v;
  return nullptr;
}

void Value::set(const std::string& key, Value v) {
  for (auto& [k, e] : *obj)
    if (k == key) {
      e = std::move(v);
      return;
    }
  obj->emplace_back(key, std::move(v));
}

namespace {

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  const double a = std::fabs(f);
  std::to_chars_result r;
  // Python's repr switches to exponent notation outside [1e-4, 1e16).
  if (a != 0 && (a < 1e-4 || a >= 1e16))
    r = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  else
    r = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::fixed);
  std::string s(buf, r.ptr);
  const size_t e = s.find('e');
  if (e != std::string::npos) {
    // Python writes e-05 / e+16: at least two exponent digits, explicit sign.
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    char sign = '+';
    if (exp[0] == '-' || exp[0] == '+') {
      sign = exp[0];
      exp = exp.substr(1);
    }
    if (exp.size() < 2) exp = "0" + exp;
    return mant + "e" + sign + exp;
  }
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_dump(const Value& v, int indent, int depth, std::string& out) {
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Value::Kind::kUndefined: case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.b ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.i); return;
    case Value::Kind::kFloat:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      return;
    case Value::Kind::kString: json_string(v.s, out); return;
    case Value::Kind::kFunction: throw Error("chat template: tojson: cannot serialize a function");
    case Value::Kind::kArray: {
      if (v.arr->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.arr->size(); ++k) {
        if (k) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        json_dump((*v.arr)[k], indent, depth + 1, out);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kObject: {
      if (v.obj->empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, e] : *v.obj) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(depth + 1);
        json_string(k, out);
        out += ": ";
        json_dump(e, indent, depth + 1, out);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
  }
}

}  // namespace

std::string Value::str() const {
  switch (kind) {
    case Kind::kUndefined: return "";
    case Kind::kString: return s;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b ? "True" : "False";
    case Kind::kInt: return std::to_string(i);
    case Kind::kFloat: return float_repr(f);
    case Kind::kString: return string_repr(s);
    case Kind::kFunction: return "<function>";
    case Kind::kArray: {
      std::string out = "[";
      for (size_t k = 0; k < arr->size(); ++k) out += (k ? ", " : "") + (*arr)[k].repr();
      return out + "]";
    }
    case Kind::kObject: {
      if (is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : *obj) {
        out += (first ? "" : ", ") + string_repr(k) + ": " + v.repr();
        first = false;
      }
      return out + "}";
    }
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kArray: return "list";
    case Kind::kObject: return "dict";
    case Kind::kFunction: return "function";
  }
  return "?";
}

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() || a.kind == K::kBool) {
    if (!(b.is_number() || b.kind == K::kBool)) return false;
    auto num = [](const Value& v) { return v.kind == K::kBool ? (v.b ? 1.0 : 0.0) : v.as_double(); };
    if (a.kind != K::kFloat && b.kind != K::kFloat) {
      auto in = [](const Value& v) { return v.kind == K::kBool ? int64_t{v.b} : v.i; };
      return in(a) == in(b);
    }
    return num(a) == num(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::kUndefined: case K::kNone: return true;
    case K::kString: return a.s == b.s;
    case K::kArray:
      if (a.arr->size() != b.arr->size()) return false;
      for (size_t k = 0; k < a.arr->size(); ++k)
        if (!equals((*a.arr)[k], (*b.arr)[k])) return false;
      return true;
    case K::kObject:
      if (a.obj->size() != b.obj->size()) return false;
      for (const auto& [k, v] : *a.obj) {
        const Value* o = b.find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    case K::kFunction: return a.fn == b.fn;
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  using K = Value::Kind;
  auto numeric = [](const Value& v) { return v.is_number() || v.kind == K::kBool; };
  if (numeric(a) && numeric(b)) {
    auto num = [](const Value& v) { return v.kind == K::kBool ? (v.b ? 1.0 : 0.0) : v.as_double(); };
    const double x = num(a), y = num(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;  // UTF-8 order = code point order
  if (a.kind == K::kArray && b.kind == K::kArray) {
    for (size_t k = 0; k < a.arr->size() && k < b.arr->size(); ++k) {
      if (equals((*a.arr)[k], (*b.arr)[k])) continue;
      return compare((*a.arr)[k], (*b.arr)[k]);
    }
    return a.arr->size() < b.arr->size() ? -1 : a.arr->size() > b.arr->size() ? 1 : 0;
  }
  throw Error("chat template: cannot compare " + a.type_name() + " with " + b.type_name());
}

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_dump(v, indent, 0, out);
  return out;
}

nlohmann::ordered_json to_nlohmann(const Value& v) { return nlohmann::ordered_json::parse(to_json(v)); }

Value CallArgs::get(size_t pos, const char* name, Value fallback) const {
  for (const auto& [k, v] : kwargs)
    if (k == name) return v;
  if (pos < args.size()) return args[pos];
  return fallback;
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

std::vector<char32_t> to_u32(const std::string& s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t bad = 1;
    if (utf8::sequence_length(s, i, &bad) == 0) {
      // Callers may pass strings built outside JSON parsing; never read past the end.
      out.push_back(0xFFFD);
      i += bad;
      continue;
    }
    out.push_back(utf8::next_code_point(s, i));
  }
  return out;
}

std::string from_u32(const std::vector<char32_t>& s, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end; ++k) utf8::append_code_point(s[k], out);
  return out;
}

}  // namespace dflash::jinja
