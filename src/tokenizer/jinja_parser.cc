// Lexer and recursive-descent parser following jinja2's grammar and operator precedence:
// or < and < not < comparisons < + - < ~ < * / // % < ** < unary < postfix/filters/tests.
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "tokenizer/jinja_ast.h"
#include "util/error.h"

namespace dflash::jinja {
namespace {

struct Token {
  enum Kind { kText, kVarBegin, kBlockBegin, kEnd, kName, kString, kInt, kFloat, kOp, kEof } kind;
  std::string value;
  int line;
};

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& where) : src_(src), where_(where) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t open = find_open(pos_);
      std::string text = src_.substr(pos_, open - pos_);
      if (open == src_.size()) {
        push(Token::kText, text);
        pos_ = open;
        break;
      }
      const char type = src_[open + 1];  // '{', '%' or '#'
      const char sign = open + 2 < src_.size() ? src_[open + 2] : 0;
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
        text.resize(e);
      } else if (sign != '+' && type != '{') {
        // lstrip_blocks: drop spaces before a block tag when they are all the line holds.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
          bool blank = true;
          for (size_t k = l_pos; k < text.size(); ++k)
            if (!std::isspace(static_cast<unsigned char>(text[k]))) blank = false;
          if (blank) text.resize(l_pos);
        }
      }
      push(Token::kText, text);
      line_ += count_newlines(pos_, open);
      pos_ = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      std::string consumed_end;
      if (type == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string::npos) fail("unterminated comment");
        const bool strip = close > pos_ && src_[close - 1] == '-';
        line_ += count_newlines(pos_, close);
        pos_ = close + 2;
        consumed_end = after_tag(strip, true);
      } else {
        push(type == '{' ? Token::kVarBegin : Token::kBlockBegin, "");
        const bool strip = lex_expression(type == '{' ? '}' : '%');
        push(Token::kEnd, "");
        consumed_end = after_tag(strip, type == '%');
      }
      line_starting = consumed_end.empty() ? src_[pos_ - 1] == '\n' : consumed_end.back() == '\n';
    }
    push(Token::kEof, "");
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& msg) {
    throw Error(where_ + ": line " + std::to_string(line_) + ": " + msg);
  }
  void push(Token::Kind k, std::string v) { tokens_.push_back({k, std::move(v), line_}); }
  int count_newlines(size_t a, size_t b) {
    int n = 0;
    for (size_t k = a; k < b && k < src_.size(); ++k) n += src_[k] == '\n';
    return n;
  }
  size_t find_open(size_t from) {
    for (size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return src_.size();
  }
  // Consumes what follows a tag's end: all whitespace after "-", one newline (trim_blocks).
  std::string after_tag(bool strip, bool block) {
    const size_t start = pos_;
    if (strip) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) ++pos_;
    } else if (block && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_ += count_newlines(start, pos_);
    return src_.substr(start, pos_ - start) + (pos_ == start ? "" : "");
  }
  // Lexes expression tokens up to the closing "}}" / "%}". Returns whether it was "-}}"/"-%}".
  bool lex_expression(char closer) {
    while (true) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) {
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= src_.size()) fail("unterminated tag");
      const char c = src_[pos_];
      auto at = [&](const char* s) { return src_.compare(pos_, std::strlen(s), s) == 0; };
      if (c == '-' && pos_ + 2 < src_.size() + 0 && src_[pos_ + 1] == closer && src_[pos_ + 2] == '}') {
        pos_ += 3;
        return true;
      }
      if (c == closer && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') {
        pos_ += 2;
        return false;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        push(Token::kName, src_.substr(pos_, e - pos_));
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos_;
        bool is_float = false;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        std::string num;
        for (size_t k = pos_; k < e; ++k)
          if (src_[k] != '_') num += src_[k];
        push(is_float ? Token::kFloat : Token::kInt, num);
        pos_ = e;
      } else if (c == '\'' || c == '"') {
        push(Token::kString, lex_string(c));
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                                          "~", "<", ">", "=", "(", ")", "[", "]", "{", "}", ",",
                                          ".", ":", "|"};
        bool found = false;
        for (const char* op : ops)
          if (at(op)) {
            push(Token::kOp, op);
            pos_ += std::strlen(op);
            found = true;
            break;
          }
        if (!found) fail(std::string("unexpected character '") + c + "'");
      }
    }
  }
  std::string lex_string(char quote) {
    std::string out;
    ++pos_;
    while (pos_ < src_.size() && src_[pos_] != quote) {
      char c = src_[pos_++];
      if (c == '\n') ++line_;
      if (c != '\\' || pos_ >= src_.size()) {
        out += c;
        continue;
      }
      const char e = src_[pos_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '0': out += '\0'; break;
        default:
          out += '\\';
          out += e;
      }
    }
    if (pos_ >= src_.size()) fail("unterminated string literal");
    ++pos_;
    return out;
  }

  const std::string& src_;
  const std::string& where_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& where) : t_(std::move(tokens)), where_(where) {}

  NodePtr parse_template() {
    auto root = std::make_shared<Node>();
    root->kind = Node::Kind::kBody;
    std::string end;
    root->body = parse_body({}, &end);
    return root;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) {
    throw Error(where_ + ": line " + std::to_string(cur().line) + ": " + msg);
  }
  const Token& cur() const { return t_[p_]; }
  bool is_op(const char* op) const { return cur().kind == Token::kOp && cur().value == op; }
  bool is_name(const char* n) const { return cur().kind == Token::kName && cur().value == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "'");
    ++p_;
  }
  std::string expect_name() {
    if (cur().kind != Token::kName) fail("expected a name");
    return t_[p_++].value;
  }
  void expect_end() {
    if (cur().kind != Token::kEnd) fail("expected end of tag");
    ++p_;
  }

  // Parses nodes until a block tag whose keyword is in `stops`; leaves that keyword in *end
  // with the parser positioned after it.
  std::vector<NodePtr> parse_body(const std::vector<std::string>& stops, std::string* end) {
    std::vector<NodePtr> nodes;
    while (true) {
      const Token& tk = cur();
      if (tk.kind == Token::kEof) {
        if (!stops.empty()) fail("unexpected end of template, expected '" + stops[0] + "'");
        return nodes;
      }
      if (tk.kind == Token::kText) {
        if (!tk.value.empty()) {
          auto n = std::make_shared<Node>();
          n->kind = Node::Kind::kText;
          n->text = tk.value;
          nodes.push_back(n);
        }
        ++p_;
        continue;
      }
      if (tk.kind == Token::kVarBegin) {
        ++p_;
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = tk.line;
        n->expr = parse_expr();
        expect_end();
        nodes.push_back(n);
        continue;
      }
      // Block tag.
      ++p_;
      const std::string kw = expect_name();
      for (const auto& s : stops)
        if (kw == s) {
          *end = kw;
          return nodes;
        }
      nodes.push_back(parse_statement(kw, tk.line));
    }
  }

  NodePtr parse_statement(const std::string& kw, int line) {
    Depth guard(this);
    auto n = std::make_shared<Node>();
    n->line = line;
    if (kw == "if") {
      n->kind = Node::Kind::kIf;
      n->conditions.push_back(parse_expr());
      expect_end();
      while (true) {
        std::string end;
        n->branches.push_back(parse_body({"elif", "else", "endif"}, &end));
        if (end == "elif") {
          n->conditions.push_back(parse_expr());
          expect_end();
        } else if (end == "else") {
          expect_end();
          n->branches.push_back(parse_body({"endif"}, &end));
          expect_end();
          break;
        } else {
          expect_end();
          break;
        }
      }
      return n;
    }
    if (kw == "for") {
      n->kind = Node::Kind::kFor;
      n->targets.push_back(expect_name());
      while (is_op(",")) {
        ++p_;
        n->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail("expected 'in'");
      ++p_;
      n->expr = parse_or(/*allow_conditional=*/false);
      if (is_name("if")) {
        ++p_;
        n->filter = parse_expr();
      }
      if (is_name("recursive")) fail("recursive loops are not supported");
      expect_end();
      std::string end;
      n->branches.push_back(parse_body({"else", "endfor"}, &end));
      if (end == "else") {
        expect_end();
        n->branches.push_back(parse_body({"endfor"}, &end));
      }
      expect_end();
      return n;
    }
    if (kw == "set") {
      n->targets.push_back(expect_name());
      if (is_op(".")) {
        ++p_;
        n->attr = expect_name();
      }
      while (is_op(",")) {
        ++p_;
        n->targets.push_back(expect_name());
      }
      if (is_op("=")) {
        ++p_;
        n->kind = Node::Kind::kSet;
        n->expr = parse_tuple_or_expr();
        expect_end();
        return n;
      }
      n->kind = Node::Kind::kSetBlock;
      expect_end();
      std::string end;
      n->body = parse_body({"endset"}, &end);
      expect_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_end();
      return n;
    }
    if (kw == "generation") {  // transformers' AssistantTracker marker: renders its body
      n->kind = Node::Kind::kBody;
      expect_end();
      std::string end;
      n->body = parse_body({"endgeneration"}, &end);
      expect_end();
      return n;
    }
    fail("unsupported tag '" + kw + "'");
  }

  int64_t int_literal(const std::string& text) {
    int64_t v = 0;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size()) fail("integer literal out of range: " + text);
    return v;
  }

  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  ExprPtr parse_tuple_or_expr() {
    ExprPtr first = parse_expr();
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::kTuple, cur().line);
    t->items.push_back(first);
    while (is_op(",")) {
      ++p_;
      t->items.push_back(parse_expr());
    }
    return t;
  }

  // Bounds recursion so that deeply nested input is an error, not a stack overflow.
  struct Depth {
    Parser* p;
    explicit Depth(Parser* parser) : p(parser) {
      if (++p->depth_ > 200) p->fail("nesting too deep");
    }
    ~Depth() { --p->depth_; }
  };

  ExprPtr parse_expr() { return parse_or(true); }

  ExprPtr parse_or(bool allow_conditional) {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      auto b = make(Expr::Kind::kBinary, cur().line);
      ++p_;
      b->name = "or";
      b->a = e;
      b->b = parse_and();
      e = b;
    }
    if (allow_conditional && is_name("if")) {
      auto c = make(Expr::Kind::kConditional, cur().line);
      ++p_;
      c->b = e;
      c->a = parse_or(false);
      if (is_name("else")) {
        ++p_;
        c->c = parse_or(true);
      }
      return c;
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      auto b = make(Expr::Kind::kBinary, cur().line);
      ++p_;
      b->name = "and";
      b->a = e;
      b->b = parse_not();
      e = b;
    }
    return e;
  }
  ExprPtr parse_not() {
    Depth guard(this);
    if (is_name("not")) {
      auto u = make(Expr::Kind::kUnary, cur().line);
      ++p_;
      u->name = "not";
      u->a = parse_not();
      return u;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      std::string op;
      if (cur().kind == Token::kOp && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                       cur().value == ">" || cur().value == "<=" || cur().value == ">=")) {
        op = cur().value;
        ++p_;
      } else if (is_name("in")) {
        op = "in";
        ++p_;
      } else if (is_name("not") && t_[p_ + 1].kind == Token::kName && t_[p_ + 1].value == "in") {
        op = "not in";
        p_ += 2;
      } else {
        return e;
      }
      auto b = make(Expr::Kind::kBinary, cur().line);
      b->name = op;
      b->a = e;
      b->b = parse_math1();
      e = b;
    }
  }
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b) {
    auto n = make(Expr::Kind::kBinary, a->line);
    n->name = op;
    n->a = std::move(a);
    n->b = std::move(b);
    return n;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = t_[p_++].value;
      e = binary(op, e, parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      ++p_;
      e = binary("~", e, parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = t_[p_++].value;
      e = binary(op, e, parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      ++p_;
      e = binary("**", e, parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    Depth guard(this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      auto u = make(Expr::Kind::kUnary, cur().line);
      u->name = t_[p_++].value;
      u->a = parse_unary(false);
      e = u;
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(e) : e;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    if (tk.kind == Token::kString) {
      auto e = make(Expr::Kind::kLiteral, tk.line);
      std::string s;
      while (cur().kind == Token::kString) s += t_[p_++].value;  // adjacent literals concatenate
      e->literal = Value::string(s);
      return e;
    }
    if (tk.kind == Token::kInt || tk.kind == Token::kFloat) {
      auto e = make(Expr::Kind::kLiteral, tk.line);
      e->literal = tk.kind == Token::kInt ? Value::integer(int_literal(tk.value))
                                          : Value::number(std::strtod(tk.value.c_str(), nullptr));
      ++p_;
      return e;
    }
    if (tk.kind == Token::kName) {
      ++p_;
      auto e = make(Expr::Kind::kLiteral, tk.line);
      if (tk.value == "true" || tk.value == "True") e->literal = Value::boolean(true);
      else if (tk.value == "false" || tk.value == "False") e->literal = Value::boolean(false);
      else if (tk.value == "none" || tk.value == "None") e->literal = Value::none();
      else {
        e->kind = Expr::Kind::kName;
        e->name = tk.value;
      }
      return e;
    }
    if (is_op("(")) {
      ++p_;
      if (is_op(")")) {
        ++p_;
        return make(Expr::Kind::kTuple, tk.line);
      }
      ExprPtr e = parse_tuple_or_expr();
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++p_;
      auto e = make(Expr::Kind::kList, tk.line);
      while (!is_op("]")) {
        e->items.push_back(parse_expr());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      ++p_;
      auto e = make(Expr::Kind::kDict, tk.line);
      while (!is_op("}")) {
        e->items.push_back(parse_expr());
        expect_op(":");
        e->values.push_back(parse_expr());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("}");
      return e;
    }
    fail("unexpected token '" + tk.value + "'");
  }

  void parse_call_args(const ExprPtr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().kind == Token::kName && t_[p_ + 1].kind == Token::kOp && t_[p_ + 1].value == "=") {
        std::string key = t_[p_].value;
        p_ += 2;
        call->kwargs.emplace_back(key, parse_expr());
      } else {
        call->items.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        ++p_;
        auto a = make(Expr::Kind::kAttr, e->line);
        a->a = e;
        if (cur().kind == Token::kInt) {
          a->kind = Expr::Kind::kItem;
          a->b = make(Expr::Kind::kLiteral, e->line);
          a->b->literal = Value::integer(int_literal(t_[p_++].value));
        } else {
          a->name = expect_name();
        }
        e = a;
      } else if (is_op("[")) {
        ++p_;
        ExprPtr start, stop, step;
        bool slice = false;
        if (!is_op(":")) start = parse_expr();
        if (is_op(":")) {
          slice = true;
          ++p_;
          if (!is_op("]") && !is_op(":")) stop = parse_expr();
          if (is_op(":")) {
            ++p_;
            if (!is_op("]")) step = parse_expr();
          }
        }
        expect_op("]");
        auto s = make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, e->line);
        s->a = e;
        s->items = {start, stop, step};
        s->b = start;
        e = s;
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::kCall, e->line);
        c->a = e;
        parse_call_args(c);
        e = c;
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        ++p_;
        auto f = make(Expr::Kind::kFilter, e->line);
        f->a = e;
        f->name = expect_name();
        if (is_op("(")) parse_call_args(f);
        e = f;
      } else if (is_name("is")) {
        ++p_;
        auto t = make(Expr::Kind::kTest, e->line);
        t->a = e;
        if (is_name("not")) {
          t->negated = true;
          ++p_;
        }
        t->name = expect_name();
        if (is_op("(")) {
          parse_call_args(t);
        } else if (cur().kind == Token::kString || cur().kind == Token::kInt ||
                   cur().kind == Token::kFloat ||
                   (cur().kind == Token::kName && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("in") && !is_name("is") && !is_name("not"))) {
          t->items.push_back(parse_primary());  // "is sameas false", "is divisibleby 3"
        }
        e = t;
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::kCall, e->line);
        c->a = e;
        parse_call_args(c);
        e = c;
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  const std::string& where_;
  size_t p_ = 0;
  int depth_ = 0;
};

}  // namespace

NodePtr parse(const std::string& source, const std::string& where) {
  Lexer lexer(source, where);
  Parser parser(lexer.run(), where);
  return parser.parse_template();
}

}  // namespace dflash::jinja
