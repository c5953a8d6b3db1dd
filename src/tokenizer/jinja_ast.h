#pragma once
// Syntax tree of a parsed Jinja template (the subset HF chat templates use).
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace dflash::jinja {

struct Expr;
using ExprPtr = std::shared_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kUnary, kBinary,
    kConditional, kList, kDict, kTuple
  };
  Kind kind;
  int line = 0;
  Value literal;                    // kLiteral
  std::string name;                 // kName, kAttr, kFilter, kTest; operator for kUnary/kBinary
  ExprPtr a, b, c;                  // operands: object/left, index/right, step/else
  std::vector<ExprPtr> items;       // call/filter/test positional args, list/tuple items, dict keys
  std::vector<ExprPtr> values;      // dict values
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;             // kTest: "is not"
};

struct Node;
using NodePtr = std::shared_ptr<Node>;

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kBody };
  Kind kind;
  int line = 0;
  std::string text;                           // kText
  ExprPtr expr;                               // kOutput, kSet value, kFor iterable
  std::vector<ExprPtr> conditions;            // kIf: one per branch (else has none)
  std::vector<std::vector<NodePtr>> branches;  // kIf branches (+ else); kFor body (+ else)
  std::vector<std::string> targets;           // kFor loop variables, kSet target names
  std::string attr;                           // kSet: ns.attr target
  ExprPtr filter;                             // kFor: "if" condition
  std::vector<NodePtr> body;                  // kBody, kSetBlock
};

// Parses `source` with trim_blocks and lstrip_blocks on (transformers' settings).
NodePtr parse(const std::string& source, const std::string& where);

}  // namespace dflash::jinja
