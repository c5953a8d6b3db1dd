#include "tokenizer/jinja_builtins.h"

#include <algorithm>
#include <ctime>

#include "util/error.h"

namespace dflash::jinja {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error(msg); }

const std::string& need_string(const Value& v, const char* what) {
  if (!v.is_string()) fail(std::string(what) + ": expected a string, got " + v.type_name());
  return v.s;
}

// Python str.strip family. `chars` undefined/None means whitespace.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto u = to_u32(s);
  std::vector<char32_t> set;
  const bool ws = chars.is_undefined() || chars.is_none();
  if (!ws) set = to_u32(need_string(chars, "strip"));
  auto drop = [&](char32_t c) { return ws ? is_py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && drop(u[b])) ++b;
  if (right)
    while (e > b && drop(u[e - 1])) --e;
  return from_u32(u, b, e);
}

Value split(const std::string& s, const Value& sep, const Value& maxsplit_v) {
  int64_t maxsplit = maxsplit_v.kind == Value::Kind::kInt ? maxsplit_v.i : -1;
  Array parts;
  if (sep.is_undefined() || sep.is_none()) {
    const auto u = to_u32(s);
    size_t k = 0;
    while (true) {
      while (k < u.size() && is_py_space(u[k])) ++k;
      if (k >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = u.size();
        while (e > k && is_py_space(u[e - 1])) --e;
        parts.push_back(Value::string(from_u32(u, k, e)));
        break;
      }
      size_t e = k;
      while (e < u.size() && !is_py_space(u[e])) ++e;
      parts.push_back(Value::string(from_u32(u, k, e)));
      k = e;
    }
    return Value::array(std::move(parts));
  }
  const std::string& d = need_string(sep, "split");
  if (d.empty()) fail("split: empty separator");
  size_t start = 0;
  while (true) {
    const size_t f = s.find(d, start);
    if (f == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
      parts.push_back(Value::string(s.substr(start)));
      break;
    }
    parts.push_back(Value::string(s.substr(start, f - start)));
    start = f + d.size();
  }
  return Value::array(std::move(parts));
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) fail("replace: empty pattern is not supported");
  std::string out;
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(from, start);
    if (f == std::string::npos) break;
    out += s.substr(start, f - start) + to;
    start = f + from.size();
    ++n;
  }
  return out + s.substr(start);
}

bool prefix_test(const std::string& s, const Value& arg, bool suffix) {
  auto one = [&](const std::string& p) {
    return suffix ? s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0
                  : s.compare(0, p.size(), p) == 0;
  };
  if (arg.kind == Value::Kind::kArray) {
    for (const auto& a : *arg.arr)
      if (one(need_string(a, "startswith/endswith"))) return true;
    return false;
  }
  return one(need_string(arg, "startswith/endswith"));
}

std::string case_map(const std::string& s, int mode) {  // 0 lower, 1 upper (ASCII + Latin via towlower is locale-bound)
  std::string out = s;
  for (auto& c : out) {
    if (mode == 0 && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (mode == 1 && c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const Value* f = cur.find(key);
    cur = f ? *f : Value::undefined(key);
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

}  // namespace

size_t length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString: return to_u32(v.s).size();
    case Value::Kind::kArray: return v.arr->size();
    case Value::Kind::kObject: return v.obj->size();
    case Value::Kind::kUndefined: return 0;
    default: fail("object of type '" + v.type_name() + "' has no len()");
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.kind == Value::Kind::kObject) {
    if (!key.is_string()) return Value::undefined();
    const Value* v = obj.find(key.s);
    return v ? *v : Value::undefined(key.s);
  }
  if (key.kind != Value::Kind::kInt) return Value::undefined();
  if (obj.kind == Value::Kind::kArray) {
    int64_t k = key.i < 0 ? key.i + static_cast<int64_t>(obj.arr->size()) : key.i;
    if (k < 0 || k >= static_cast<int64_t>(obj.arr->size())) return Value::undefined("item");
    return (*obj.arr)[k];
  }
  if (obj.is_string()) {
    const auto u = to_u32(obj.s);
    int64_t k = key.i < 0 ? key.i + static_cast<int64_t>(u.size()) : key.i;
    if (k < 0 || k >= static_cast<int64_t>(u.size())) return Value::undefined("item");
    return Value::string(from_u32(u, k, k + 1));
  }
  return Value::undefined();
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  const int64_t step = step_v.kind == Value::Kind::kInt ? step_v.i : 1;
  if (step == 0) fail("slice step cannot be zero");
  std::vector<char32_t> u;
  int64_t n;
  if (obj.is_string()) {
    u = to_u32(obj.s);
    n = static_cast<int64_t>(u.size());
  } else if (obj.kind == Value::Kind::kArray) {
    n = static_cast<int64_t>(obj.arr->size());
  } else {
    fail("cannot slice a value of type '" + obj.type_name() + "'");
  }
  // Python's slice.indices().
  auto norm = [&](const Value& v, int64_t dflt) {
    if (v.kind != Value::Kind::kInt) return dflt;
    int64_t k = v.i;
    if (k < 0) k += n;
    if (step > 0) return std::clamp<int64_t>(k, 0, n);
    return std::clamp<int64_t>(k, -1, n - 1);
  };
  const int64_t start = norm(start_v, step > 0 ? 0 : n - 1);
  const int64_t stop = norm(stop_v, step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (__int128 k = start; step > 0 ? k < stop : k > stop; k += step) idx.push_back(static_cast<int64_t>(k));
  if (obj.is_string()) {
    std::vector<char32_t> r;
    for (int64_t k : idx) r.push_back(u[k]);
    return Value::string(from_u32(r, 0, r.size()));
  }
  Array r;
  for (int64_t k : idx) r.push_back((*obj.arr)[k]);
  return Value::array(std::move(r));
}

std::optional<Value> call_method(const Value& self, const std::string& name, CallArgs& args) {
  if (self.is_string()) {
    const std::string& s = self.s;
    if (name == "startswith") return Value::boolean(prefix_test(s, args.get(0, "prefix"), false));
    if (name == "endswith") return Value::boolean(prefix_test(s, args.get(0, "suffix"), true));
    if (name == "strip") return Value::string(strip(s, args.get(0, "chars"), true, true));
    if (name == "lstrip") return Value::string(strip(s, args.get(0, "chars"), true, false));
    if (name == "rstrip") return Value::string(strip(s, args.get(0, "chars"), false, true));
    if (name == "split") return split(s, args.get(0, "sep"), args.get(1, "maxsplit"));
    if (name == "lower") return Value::string(case_map(s, 0));
    if (name == "upper") return Value::string(case_map(s, 1));
    if (name == "replace") {
      const Value count = args.get(2, "count");
      return Value::string(replace(s, need_string(args.get(0, "old"), "replace"),
                                   need_string(args.get(1, "new"), "replace"),
                                   count.kind == Value::Kind::kInt ? count.i : -1));
    }
    if (name == "find") {
      const size_t f = s.find(need_string(args.get(0, "sub"), "find"));
      return Value::integer(f == std::string::npos ? -1 : static_cast<int64_t>(to_u32(s.substr(0, f)).size()));
    }
    if (name == "count") {
      const std::string sub = need_string(args.get(0, "sub"), "count");  // a copy: the Value is a temporary
      int64_t n = 0;
      for (size_t f = s.find(sub); !sub.empty() && f != std::string::npos; f = s.find(sub, f + sub.size())) ++n;
      return Value::integer(n);
    }
    if (name == "join") {
      const Value items = args.get(0, "iterable");
      if (items.kind != Value::Kind::kArray) fail("join: expected a list");
      std::string out;
      for (size_t k = 0; k < items.arr->size(); ++k) out += (k ? s : "") + need_string((*items.arr)[k], "join");
      return Value::string(out);
    }
    return std::nullopt;
  }
  if (self.kind == Value::Kind::kObject && !self.is_namespace) {
    if (name == "items") {
      Array r;
      for (const auto& [k, v] : *self.obj) r.push_back(Value::array({Value::string(k), v}));
      return Value::array(std::move(r));
    }
    if (name == "keys") {
      Array r;
      for (const auto& [k, v] : *self.obj) r.push_back(Value::string(k));
      return Value::array(std::move(r));
    }
    if (name == "values") {
      Array r;
      for (const auto& [k, v] : *self.obj) r.push_back(v);
      return Value::array(std::move(r));
    }
    if (name == "get") {
      const Value* v = self.find(need_string(args.get(0, "key"), "get"));
      return v ? *v : args.get(1, "default", Value::none());
    }
  }
  return std::nullopt;
}

Value apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  if (name == "length" || name == "count") return Value::integer(static_cast<int64_t>(length(input)));
  if (name == "trim") return Value::string(strip(input.str(), args.get(0, "chars"), true, true));
  if (name == "tojson") {
    const Value indent = args.get(0, "indent");
    return Value::string(to_json(input, indent.kind == Value::Kind::kInt ? static_cast<int>(indent.i) : -1));
  }
  if (name == "string") return Value::string(input.str());
  if (name == "safe" || name == "e" || name == "escape") {
    if (name != "safe") fail("filter '" + name + "' is not supported");
    return input;
  }
  if (name == "lower") return Value::string(case_map(input.str(), 0));
  if (name == "upper") return Value::string(case_map(input.str(), 1));
  if (name == "capitalize") {
    std::string s = case_map(input.str(), 0);
    if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
    return Value::string(s);
  }
  if (name == "int") {
    if (input.kind == Value::Kind::kInt) return input;
    if (input.kind == Value::Kind::kFloat) {
      if (!(input.f > -9.2e18 && input.f < 9.2e18)) fail("int: value out of range");
      return Value::integer(static_cast<int64_t>(input.f));
    }
    if (input.kind == Value::Kind::kBool) return Value::integer(input.b);
    if (input.is_string()) {
      try {
        return Value::integer(std::stoll(strip(input.s, Value::undefined(), true, true)));
      } catch (...) {
      }
    }
    return args.get(0, "default", Value::integer(0));
  }
  if (name == "float") {
    if (input.is_number()) return Value::number(input.as_double());
    if (input.is_string()) {
      try {
        return Value::number(std::stod(input.s));
      } catch (...) {
      }
    }
    return args.get(0, "default", Value::number(0));
  }
  if (name == "abs") {
    if (input.kind == Value::Kind::kInt && input.i != INT64_MIN) return Value::integer(input.i < 0 ? -input.i : input.i);
    if (input.kind == Value::Kind::kFloat) return Value::number(input.f < 0 ? -input.f : input.f);
    fail("abs: expected a number");
  }
  if (name == "first" || name == "last") {
    if (input.kind == Value::Kind::kArray) {
      if (input.arr->empty()) return Value::undefined(name);
      return name == "first" ? input.arr->front() : input.arr->back();
    }
    if (input.is_string()) {
      const auto u = to_u32(input.s);
      if (u.empty()) return Value::undefined(name);
      return Value::string(name == "first" ? from_u32(u, 0, 1) : from_u32(u, u.size() - 1, u.size()));
    }
    fail(name + ": expected a list or string");
  }
  if (name == "join") {
    const Value sep = args.get(0, "d", Value::string(""));
    const Value attr = args.get(1, "attribute");
    if (input.kind != Value::Kind::kArray) fail("join: expected a list");
    std::string out;
    for (size_t k = 0; k < input.arr->size(); ++k) {
      const Value& item = (*input.arr)[k];
      out += (k ? sep.str() : "") + (attr.is_string() ? attribute_of(item, attr.s) : item).str();
    }
    return Value::string(out);
  }
  if (name == "default" || name == "d") {
    const bool boolean = args.get(1, "boolean", Value::boolean(false)).truthy();
    if (input.is_undefined() || (boolean && !input.truthy())) return args.get(0, "default_value", Value::string(""));
    return input;
  }
  if (name == "list") {
    if (input.kind == Value::Kind::kArray) return Value::array(*input.arr);
    if (input.is_string()) {
      Array r;
      const auto u = to_u32(input.s);
      for (size_t k = 0; k < u.size(); ++k) r.push_back(Value::string(from_u32(u, k, k + 1)));
      return Value::array(std::move(r));
    }
    if (input.kind == Value::Kind::kObject) {
      CallArgs none;
      return *call_method(input, "keys", none);
    }
    fail("list: cannot convert " + input.type_name());
  }
  if (name == "items") {
    if (input.kind != Value::Kind::kObject) fail("items: expected a mapping");
    CallArgs none;
    return *call_method(input, "items", none);
  }
  if (name == "reverse") {
    if (input.is_string()) return slice(input, Value::none(), Value::none(), Value::integer(-1));
    if (input.kind != Value::Kind::kArray) fail("reverse: expected a list or string");
    Array r(input.arr->rbegin(), input.arr->rend());
    return Value::array(std::move(r));
  }
  if (name == "replace") {
    const Value count = args.get(2, "count");
    return Value::string(replace(input.str(), need_string(args.get(0, "old"), "replace"),
                                 need_string(args.get(1, "new"), "replace"),
                                 count.kind == Value::Kind::kInt ? count.i : -1));
  }
  if (name == "selectattr" || name == "rejectattr") {
    if (input.kind != Value::Kind::kArray) fail(name + ": expected a list");
    const std::string attr = need_string(args.get(0, "attr"), name.c_str());
    const Value test = args.get(1, "test");
    Array r;
    for (const auto& item : *input.arr) {
      const Value v = attribute_of(item, attr);
      bool ok;
      if (test.is_undefined()) {
        ok = v.truthy();
      } else {
        CallArgs targs;
        for (size_t k = 2; k < args.args.size(); ++k) targs.args.push_back(args.args[k]);
        ok = apply_test(need_string(test, name.c_str()), v, targs);
      }
      if (ok == (name == "selectattr")) r.push_back(item);
    }
    return Value::array(std::move(r));
  }
  if (name == "map") {
    if (input.kind != Value::Kind::kArray) fail("map: expected a list");
    const Value attr = args.get(99, "attribute");
    Array r;
    if (attr.is_string()) {
      for (const auto& item : *input.arr) r.push_back(attribute_of(item, attr.s));
    } else {
      const std::string f = need_string(args.get(0, "filter"), "map");
      CallArgs rest;
      for (size_t k = 1; k < args.args.size(); ++k) rest.args.push_back(args.args[k]);
      for (const auto& item : *input.arr) r.push_back(apply_filter(f, item, rest));
    }
    return Value::array(std::move(r));
  }
  fail("unsupported filter '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, CallArgs& args) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == K::kInt;
  if (name == "float") return v.kind == K::kFloat;
  if (name == "boolean") return v.kind == K::kBool;
  if (name == "true") return v.kind == K::kBool && v.b;
  if (name == "false") return v.kind == K::kBool && !v.b;
  if (name == "mapping") return v.kind == K::kObject;
  if (name == "sequence") return v.kind == K::kArray || v.is_string() || v.kind == K::kObject;
  if (name == "iterable") return v.kind == K::kArray || v.is_string() || v.kind == K::kObject;
  if (name == "callable") return v.kind == K::kFunction;
  if (name == "odd" || name == "even") {
    if (v.kind != K::kInt) fail(name + ": expected an integer");
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value d = args.get(0, "num");
    if (v.kind != K::kInt || d.kind != K::kInt || d.i == 0) fail("divisibleby: expected integers");
    return v.i % d.i == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, args.get(0, "other"));
  if (name == "ne" || name == "!=") return !equals(v, args.get(0, "other"));
  if (name == "sameas") {
    const Value o = args.get(0, "other");
    if (v.kind != o.kind) return false;
    if (v.kind == K::kBool) return v.b == o.b;
    if (v.kind == K::kNone || v.kind == K::kUndefined) return true;
    return equals(v, o) && (v.kind == K::kInt || v.kind == K::kString);
  }
  if (name == "lt" || name == "gt" || name == "le" || name == "ge") {
    const int c = compare(v, args.get(0, "other"));
    return name == "lt" ? c < 0 : name == "gt" ? c > 0 : name == "le" ? c <= 0 : c >= 0;
  }
  if (name == "in") {
    const Value seq = args.get(0, "seq");
    if (seq.is_string()) return v.is_string() && seq.s.find(v.s) != std::string::npos;
    if (seq.kind == K::kArray)
      return std::any_of(seq.arr->begin(), seq.arr->end(), [&](const Value& x) { return equals(v, x); });
    if (seq.kind == K::kObject) return v.is_string() && seq.find(v.s);
    return false;
  }
  fail("unsupported test '" + name + "'");
}

Object make_globals() {
  Object g;
  g.emplace_back("raise_exception", Value::function([](CallArgs& a) -> Value {
                   throw Error("chat template raised an exception: " + a.get(0, "message").str());
                 }));
  g.emplace_back("namespace", Value::function([](CallArgs& a) {
                   Value ns = Value::object();
                   ns.is_namespace = true;
                   for (const auto& [k, v] : a.kwargs) ns.set(k, v);
                   return ns;
                 }));
  g.emplace_back("dict", Value::function([](CallArgs& a) {
                   Value d = Value::object();
                   for (const auto& [k, v] : a.kwargs) d.set(k, v);
                   return d;
                 }));
  g.emplace_back("range", Value::function([](CallArgs& a) {
                   int64_t start = 0, stop, step = 1;
                   for (const auto& x : a.args)
                     if (x.kind != Value::Kind::kInt) fail("range: expected integers");
                   if (a.args.size() == 1) {
                     stop = a.args[0].i;
                   } else if (a.args.size() >= 2) {
                     start = a.args[0].i;
                     stop = a.args[1].i;
                     if (a.args.size() > 2) step = a.args[2].i;
                   } else {
                     fail("range: expected 1 to 3 arguments");
                   }
                   if (step == 0) fail("range: step must not be zero");
                   // Templates never need huge ranges; refuse them instead of exhausting memory.
                   if ((static_cast<__int128>(stop) - start) / step > 1000000) fail("range: too many elements");
                   Array r;
                   for (__int128 k = start; step > 0 ? k < stop : k > stop; k += step) r.push_back(Value::integer(static_cast<int64_t>(k)));
                   return Value::array(std::move(r));
                 }));
  g.emplace_back("strftime_now", Value::function([](CallArgs& a) {
                   const std::string fmt = need_string(a.get(0, "format"), "strftime_now");
                   const std::time_t t = std::time(nullptr);
                   std::tm tm{};
                   localtime_r(&t, &tm);
                   char buf[256];
                   const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
                   return Value::string(std::string(buf, n));
                 }));
  return g;
}

}  // namespace dflash::jinja
