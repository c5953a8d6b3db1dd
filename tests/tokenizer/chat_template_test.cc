// Chat prompts must be byte-identical to jinja2 rendering the same template (goldens written
// by tools/make_tokenizer_fixtures.py), plus direct checks of the Jinja subset.
#include <gtest/gtest.h>

#include "fixtures.h"
#include "tokenizer/chat_template.h"
#include "util/error.h"

namespace dflash {
namespace {

using nlohmann::ordered_json;

class ChatGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatGoldenTest, MatchesJinja2) {
  const Tokenizer& tok = testing::tokenizer(GetParam());
  const auto lines = testing::read_lines(testing::fixture_path(GetParam() + ".chat.jsonl"));
  ASSERT_GE(lines.size(), 30u);
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto rec = ordered_json::parse(lines[i]);
    ChatOptions opts;
    opts.add_generation_prompt = rec["add_generation_prompt"].get<bool>();
    if (!rec["enable_thinking"].is_null()) opts.enable_thinking = rec["enable_thinking"].get<bool>();
    EXPECT_EQ(tok.apply_chat_template(rec["messages"], opts), rec["prompt"].get<std::string>())
        << "conversation " << i << ": " << rec["messages"].dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ChatGoldenTest, ::testing::Values("qwen3", "llama3.1"),
                         [](const auto& info) {
                           return info.param == "qwen3" ? std::string("Qwen3") : std::string("Llama31");
                         });

std::string render(const std::string& src, const ordered_json& vars = ordered_json::object()) {
  return ChatTemplate(src, "test").render(vars);
}

TEST(Jinja, WhitespaceControlFollowsTransformersSettings) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("{% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");
  EXPECT_EQ(render("x  {%- if true -%}  y  {%- endif %}"), "xy");
  EXPECT_EQ(render("{{ 'a' }}\n{{- 'b' }}"), "ab");
  EXPECT_EQ(render("  {%+ if true %}a{% endif %}"), "  a");
}

TEST(Jinja, PythonSemantics) {
  EXPECT_EQ(render("{{ [1, 2, 3][::-1] }}"), "[3, 2, 1]");
  EXPECT_EQ(render("{{ 'a</think>b'.split('</think>')[-1] }}"), "b");
  EXPECT_EQ(render("{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ '  y '.strip() }}"), "x\n|y");
  EXPECT_EQ(render("{{ none }} {{ true }} {{ 1.5 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 'ab' * 2 }}"),
            "None True 1.5 3 -4 abab");
  EXPECT_EQ(render("{{ {'a': 1, 'b': [true, none]} | tojson }}"), "{\"a\": 1, \"b\": [true, null]}");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{% set y = x %}{% endfor %}{{ y is defined }}"), "False");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"z", 1}, {"a", 2}}}}),
            "z=1;a=2;");
  EXPECT_EQ(render("{% for x in xs %}{% if loop.first %}[{% endif %}{{ x }}{% if not loop.last %},{% else %}]{% endif %}{% endfor %}",
                   {{"xs", {1, 2}}}),
            "[1,2]");
  EXPECT_EQ(render("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"), "012");
  EXPECT_EQ(render("{{ 'x' if false else 'y' }}{{ 'é'|length }}{{ missing | default('d') }}"), "y1d");
  EXPECT_EQ(render("{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='c') | join(',') }}",
                   {{"msgs", ordered_json::array({{{"role", "user"}, {"c", "a"}}, {{"role", "x"}, {"c", "b"}},
                                                  {{"role", "user"}, {"c", "c"}}})}}),
            "a,c");
}

// Found by the fuzzer: `1 ** 1639710584323` multiplied 1.6e12 times. Powers square now.
// str.count once read its argument through a reference to a temporary (fuzz_tokenizer, ASan).
TEST(Jinja, StringCountAndFindFollowPython) {
  EXPECT_EQ(render("{{ 'a{b{c'.count('{') }}|{{ 'x'.count('{') }}|{{ 'aaa'.count('aa') }}|{{ 'ab'.find('b') }}"),
            "2|0|1|1");
}

TEST(Jinja, IntegerPowersAreFastAndOverflowIsAnError) {
  EXPECT_EQ(render("{{ 2 ** 10 }}"), "1024");
  EXPECT_EQ(render("{{ (-3) ** 3 }}"), "-27");
  EXPECT_EQ(render("{{ 7 ** 0 }}"), "1");
  EXPECT_EQ(render("{{ 1 ** 1639710584323 }}"), "1");
  EXPECT_EQ(render("{{ 0 ** 1639710584323 }}"), "0");
  EXPECT_EQ(render("{{ 2 ** 62 }}"), "4611686018427387904");
  EXPECT_THROW(render("{{ 2 ** 63 }}"), Error);
  EXPECT_THROW(render("{{ 3 ** 1639710584323 }}"), Error);
}

TEST(Jinja, ErrorsAreReported) {
  EXPECT_THROW(render("{% if x %}"), Error);
  EXPECT_THROW(render("{{ 'a' + 1 }}"), Error);
  EXPECT_THROW(render("{{ raise_exception('nope') }}"), Error);
  EXPECT_THROW(render("{{ x.y }}"), Error);  // attribute of an undefined value
  EXPECT_THROW(render("{% macro m() %}{% endmacro %}"), Error);
  EXPECT_THROW(render("{{ 'a' | no_such_filter }}"), Error);
  try {
    render("line1\n{{ 1 +* 2 }}");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, QwenThinkingSwitch) {
  const Tokenizer& tok = testing::tokenizer("qwen3");
  const ordered_json msgs = ordered_json::parse(R"([{"role":"user","content":"hi"}])");
  ChatOptions opts;
  opts.enable_thinking = false;
  EXPECT_EQ(tok.apply_chat_template(msgs, opts),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  opts.enable_thinking = true;
  EXPECT_EQ(tok.apply_chat_template(msgs, opts), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  opts.add_generation_prompt = false;
  EXPECT_EQ(tok.apply_chat_template(msgs, opts), "<|im_start|>user\nhi<|im_end|>\n");
}

TEST(ChatTemplate, Llama31StartsWithBosOnce) {
  const Tokenizer& tok = testing::tokenizer("llama3.1");
  const ordered_json msgs = ordered_json::parse(R"([{"role":"user","content":" hi "}])");
  const std::string prompt = tok.apply_chat_template(msgs);
  EXPECT_EQ(prompt,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const auto ids = tok.encode(prompt, {.parse_special = true, .add_special_tokens = false});
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], *tok.bos_id());
  EXPECT_NE(ids[1], *tok.bos_id());
}

TEST(ChatTemplate, BadMessagesGiveErrors) {
  const Tokenizer& tok = testing::tokenizer("qwen3");
  EXPECT_THROW(tok.apply_chat_template(ordered_json::object()), Error);
  EXPECT_THROW(tok.apply_chat_template(ordered_json::array()), Error);  // messages[0] undefined
}

}  // namespace
}  // namespace dflash
