#include "tokenizer/jinja_render.h"

#include <cmath>
#include <unordered_map>

#include "tokenizer/jinja_builtins.h"
#include "util/error.h"

namespace dflash::jinja {
namespace {

// Limits that turn runaway templates into errors rather than exhausted memory or time.
constexpr uint64_t kMaxOutput = 64u << 20;
constexpr int64_t kMaxIterations = 10000000;

struct LoopSignal {
  bool is_break;
};

class Renderer {
 public:
  Renderer(const Object& globals, const std::string& where) : where_(where) {
    scopes_.emplace_back();
    for (const auto& [k, v] : globals) scopes_.back()[k] = v;
  }

  void run(const std::vector<NodePtr>& nodes, std::string& out) {
    for (const auto& n : nodes) {
      exec(*n, out);
      if (out.size() > kMaxOutput) fail(n->line, "output too long");
    }
  }

 private:
  [[noreturn]] void fail(int line, const std::string& msg) {
    throw Error(where_ + ": line " + std::to_string(line) + ": " + msg);
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undefined(name);
  }

  void exec(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::Kind::kText: out += n.text; return;
      case Node::Kind::kOutput: {
        const Value v = eval(*n.expr);
        out += v.str();
        return;
      }
      case Node::Kind::kBody: run(n.body, out); return;
      case Node::Kind::kIf:
        for (size_t k = 0; k < n.branches.size(); ++k) {
          if (k >= n.conditions.size() || eval(*n.conditions[k]).truthy()) {
            run(n.branches[k], out);
            return;
          }
        }
        return;
      case Node::Kind::kFor: exec_for(n, out); return;
      case Node::Kind::kSet: {
        Value v = eval(*n.expr);
        assign(n, std::move(v));
        return;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        run(n.body, captured);
        assign(n, Value::string(captured));
        return;
      }
      case Node::Kind::kBreak: throw LoopSignal{true};
      case Node::Kind::kContinue: throw LoopSignal{false};
    }
  }

  void assign(const Node& n, Value v) {
    if (!n.attr.empty()) {
      Value target = lookup(n.targets[0]);
      if (target.kind != Value::Kind::kObject || !target.is_namespace)
        fail(n.line, "cannot assign attribute '" + n.attr + "' of '" + n.targets[0] + "': not a namespace");
      target.set(n.attr, std::move(v));
      return;
    }
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = std::move(v);
      return;
    }
    if (v.kind != Value::Kind::kArray || v.arr->size() != n.targets.size())
      fail(n.line, "cannot unpack value into " + std::to_string(n.targets.size()) + " names");
    for (size_t k = 0; k < n.targets.size(); ++k) scopes_.back()[n.targets[k]] = (*v.arr)[k];
  }

  std::vector<Value> iterate(const Value& v, int line) {
    switch (v.kind) {
      case Value::Kind::kArray: return *v.arr;
      case Value::Kind::kObject: {
        std::vector<Value> keys;
        for (const auto& [k, e] : *v.obj) keys.push_back(Value::string(k));
        return keys;
      }
      case Value::Kind::kString: {
        std::vector<Value> chars;
        const auto u = to_u32(v.s);
        for (size_t k = 0; k < u.size(); ++k) chars.push_back(Value::string(from_u32(u, k, k + 1)));
        return chars;
      }
      case Value::Kind::kUndefined: return {};
      default: fail(line, "'" + v.type_name() + "' object is not iterable");
    }
  }

  void exec_for(const Node& n, std::string& out) {
    std::vector<Value> items = iterate(eval(*n.expr), n.line);
    if (n.filter) {
      std::vector<Value> kept;
      for (auto& item : items) {
        scopes_.emplace_back();
        bind(n, item);
        if (eval(*n.filter).truthy()) kept.push_back(item);
        scopes_.pop_back();
      }
      items.swap(kept);
    }
    if (items.empty()) {
      if (n.branches.size() > 1) run(n.branches[1], out);
      return;
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      if (++iterations_ > kMaxIterations) fail(n.line, "too many loop iterations");
      scopes_.emplace_back();
      bind(n, items[k]);
      Object loop{{"index", Value::integer(k + 1)},
                  {"index0", Value::integer(k)},
                  {"revindex", Value::integer(len - k)},
                  {"revindex0", Value::integer(len - k - 1)},
                  {"first", Value::boolean(k == 0)},
                  {"last", Value::boolean(k == len - 1)},
                  {"length", Value::integer(len)},
                  {"previtem", k > 0 ? items[k - 1] : Value::undefined("previtem")},
                  {"nextitem", k + 1 < len ? items[k + 1] : Value::undefined("nextitem")}};
      scopes_.back()["loop"] = Value::object(std::move(loop));
      bool stop = false;
      try {
        run(n.branches[0], out);
      } catch (const LoopSignal& s) {
        stop = s.is_break;
      }
      scopes_.pop_back();
      if (stop) break;
    }
  }

  void bind(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return;
    }
    if (item.kind != Value::Kind::kArray || item.arr->size() != n.targets.size())
      fail(n.line, "cannot unpack loop item into " + std::to_string(n.targets.size()) + " names");
    for (size_t k = 0; k < n.targets.size(); ++k) scopes_.back()[n.targets[k]] = (*item.arr)[k];
  }

  void check_defined(const Value& v, int line) {
    if (v.is_undefined())
      fail(line, "'" + (v.undefined_name.empty() ? std::string("value") : v.undefined_name) + "' is undefined");
  }

  CallArgs eval_args(const Expr& e) {
    CallArgs args;
    for (const auto& a : e.items) args.args.push_back(eval(*a));
    for (const auto& [k, a] : e.kwargs) args.kwargs.emplace_back(k, eval(*a));
    return args;
  }

  Value attr(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) fail(line, "'" + obj.undefined_name + "' is undefined (reading ." + name + ")");
    if (const Value* v = obj.find(name)) return *v;
    return Value::undefined(name);
  }

  Value eval(const Expr& e) {
    // Long operator chains parse iteratively but evaluate recursively.
    if (++eval_depth_ > 1000) fail(e.line, "expression too deeply nested");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{eval_depth_};
    return eval_inner(e);
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kAttr: return attr(eval(*e.a), e.name, e.line);
      case Expr::Kind::kItem: {
        const Value obj = eval(*e.a);
        if (obj.is_undefined()) fail(e.line, "'" + obj.undefined_name + "' is undefined (indexing)");
        return get_item(obj, eval(*e.b));
      }
      case Expr::Kind::kSlice: {
        auto opt = [&](const ExprPtr& p) { return p ? eval(*p) : Value::none(); };
        return slice(eval(*e.a), opt(e.items[0]), opt(e.items[1]), opt(e.items[2]));
      }
      case Expr::Kind::kCall: {
        CallArgs args = eval_args(e);
        if (e.a->kind == Expr::Kind::kAttr) {
          const Value self = eval(*e.a->a);
          if (self.is_undefined()) fail(e.line, "'" + self.undefined_name + "' is undefined");
          if (auto r = call_method(self, e.a->name, args)) return *r;
          const Value* member = self.find(e.a->name);
          if (member && member->kind == Value::Kind::kFunction) return (*member->fn)(args);
          fail(e.line, "'" + self.type_name() + "' object has no method '" + e.a->name + "'");
        }
        const Value callee = eval(*e.a);
        if (callee.kind != Value::Kind::kFunction)
          fail(e.line, (e.a->kind == Expr::Kind::kName ? "'" + e.a->name + "'" : std::string("value")) +
                           " is not callable");
        return (*callee.fn)(args);
      }
      case Expr::Kind::kFilter: {
        const Value input = eval(*e.a);
        CallArgs args = eval_args(e);
        try {
          return apply_filter(e.name, input, args);
        } catch (const Error& err) {
          fail(e.line, err.what());
        }
      }
      case Expr::Kind::kTest: {
        const Value input = eval(*e.a);
        CallArgs args = eval_args(e);
        bool r;
        try {
          r = apply_test(e.name, input, args);
        } catch (const Error& err) {
          fail(e.line, err.what());
        }
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.a);
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (v.kind == Value::Kind::kInt) {
          if (e.name == "-" && v.i == INT64_MIN) fail(e.line, "integer overflow");
          return Value::integer(e.name == "-" ? -v.i : v.i);
        }
        if (v.kind == Value::Kind::kFloat) return Value::number(e.name == "-" ? -v.f : v.f);
        fail(e.line, "bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
      }
      case Expr::Kind::kBinary: return binary(e);
      case Expr::Kind::kConditional:
        if (eval(*e.a).truthy()) return eval(*e.b);
        return e.c ? eval(*e.c) : Value::undefined();
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        Array a;
        for (const auto& i : e.items) a.push_back(eval(*i));
        return Value::array(std::move(a));
      }
      case Expr::Kind::kDict: {
        Value d = Value::object();
        for (size_t k = 0; k < e.items.size(); ++k) {
          const Value key = eval(*e.items[k]);
          if (!key.is_string()) fail(e.line, "only string dict keys are supported");
          d.set(key.s, eval(*e.values[k]));
        }
        return d;
      }
    }
    fail(e.line, "unknown expression");
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.a);
      return a.truthy() ? eval(*e.b) : a;
    }
    if (op == "or") {
      Value a = eval(*e.a);
      return a.truthy() ? a : eval(*e.b);
    }
    const Value a = eval(*e.a), b = eval(*e.b);
    if (op == "~") return Value::string(a.str() + b.str());
    if (op == "==") return Value::boolean(equals(a, b));
    if (op == "!=") return Value::boolean(!equals(a, b));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string()) {
        if (!a.is_string()) fail(e.line, "'in <string>' requires string as left operand");
        found = b.s.find(a.s) != std::string::npos;
      } else if (b.kind == Value::Kind::kArray) {
        for (const auto& x : *b.arr) found = found || equals(a, x);
      } else if (b.kind == Value::Kind::kObject) {
        found = a.is_string() && b.find(a.s) != nullptr;
      } else if (!b.is_undefined()) {
        fail(e.line, "argument of type '" + b.type_name() + "' is not iterable");
      }
      return Value::boolean(op == "in" ? found : !found);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      check_defined(a, e.line);
      check_defined(b, e.line);
      int c;
      try {
        c = compare(a, b);
      } catch (const Error& err) {
        fail(e.line, err.what());
      }
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    check_defined(a, e.line);
    check_defined(b, e.line);
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::string(a.s + b.s);
      if (a.kind == Value::Kind::kArray && b.kind == Value::Kind::kArray) {
        Array r = *a.arr;
        r.insert(r.end(), b.arr->begin(), b.arr->end());
        return Value::array(std::move(r));
      }
    }
    if (op == "*" && ((a.is_string() && b.kind == Value::Kind::kInt) || (b.is_string() && a.kind == Value::Kind::kInt))) {
      const std::string& s = a.is_string() ? a.s : b.s;
      const int64_t n = a.is_string() ? b.i : a.i;
      if (n > 0 && (static_cast<uint64_t>(n) > kMaxOutput || s.size() * static_cast<uint64_t>(n) > kMaxOutput)) fail(e.line, "string too long");
      std::string r;
      for (int64_t k = 0; k < n; ++k) r += s;
      return Value::string(r);
    }
    auto numeric = [](const Value& v) { return v.is_number() || v.kind == Value::Kind::kBool; };
    if (!numeric(a) || !numeric(b))
      fail(e.line, "unsupported operand types for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
    auto as_int = [](const Value& v) { return v.kind == Value::Kind::kBool ? int64_t{v.b} : v.i; };
    auto as_num = [](const Value& v) { return v.kind == Value::Kind::kBool ? double(v.b) : v.as_double(); };
    const bool ints = a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat;
    if (op == "/") {
      if (as_num(b) == 0) fail(e.line, "division by zero");
      return Value::number(as_num(a) / as_num(b));
    }
    if (ints) {
      const int64_t x = as_int(a), y = as_int(b);
      // Python integers do not overflow; ours report it instead.
      int64_t r = 0;
      if ((op == "+" && __builtin_add_overflow(x, y, &r)) || (op == "-" && __builtin_sub_overflow(x, y, &r)) ||
          (op == "*" && __builtin_mul_overflow(x, y, &r)) ||
          ((op == "//" || op == "%") && x == INT64_MIN && y == -1))
        fail(e.line, "integer overflow");
      if (op == "+" || op == "-" || op == "*") return Value::integer(r);
      if ((op == "//" || op == "%") && y == 0) fail(e.line, "division by zero");
      if (op == "//") return Value::integer(x / y - ((x % y != 0) && ((x < 0) != (y < 0))));
      if (op == "%") {
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value::integer(m);
      }
      if (op == "**" && y >= 0) {
        // Squaring, not y multiplications: `1 ** 10**12` must not take minutes (the fuzzer
        // found exactly that). Any base but -1, 0 and 1 overflows within 63 squarings.
        int64_t result = 1, base = x;
        for (int64_t n = y; n > 0; n >>= 1) {
          if ((n & 1) && __builtin_mul_overflow(result, base, &result)) fail(e.line, "integer overflow");
          if (n > 1 && __builtin_mul_overflow(base, base, &base)) fail(e.line, "integer overflow");
        }
        return Value::integer(result);
      }
    }
    const double x = as_num(a), y = as_num(b);
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "//") return Value::number(std::floor(x / y));
    if (op == "%") return Value::number(x - y * std::floor(x / y));
    if (op == "**") return Value::number(std::pow(x, y));
    fail(e.line, "unsupported operator " + op);
  }

  const std::string& where_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  int64_t iterations_ = 0;
  int eval_depth_ = 0;
};

}  // namespace

std::string render(const Node& root, const Object& globals, const std::string& where) {
  Renderer r(globals, where);
  std::string out;
  try {
    r.run(root.body, out);
  } catch (const LoopSignal&) {
    throw Error(where + ": break or continue outside a loop");
  }
  return out;
}

}  // namespace dflash::jinja
