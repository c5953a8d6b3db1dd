// Debugging subcommands over the tokenizer: tokenize, detokenize, chat-template.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace dflash::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(" \t\n"), e = item.find_last_not_of(" \t\n");
    if (b == std::string::npos) continue;
    item = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw Error("--ids: not an integer: '" + item + "'");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

const RegisterCommand tokenize_cmd(
    "tokenize", "Print the token ids of a text (debugging)", [](CLI::App& sub) {
      auto model = std::make_shared<std::string>();
      auto text = std::make_shared<std::string>();
      auto no_special = std::make_shared<bool>(false);
      auto no_add = std::make_shared<bool>(false);
      auto tokens = std::make_shared<bool>(false);
      sub.add_option("--model", *model, "Model directory with tokenizer.json")->required();
      sub.add_option("--text", *text, "Text to tokenize")->required();
      sub.add_flag("--no-special", *no_special, "Treat special tokens in the text as plain text");
      sub.add_flag("--no-add-special", *no_add, "Do not add BOS/EOS from the post-processor");
      sub.add_flag("--tokens", *tokens, "Also print each token string");
      return std::function<int()>([=] {
        const Tokenizer tok = Tokenizer::from_dir(*model);
        const auto ids = tok.encode(*text, {.parse_special = !*no_special, .add_special_tokens = !*no_add});
        std::string line;
        for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
        std::printf("%s\n", line.c_str());
        if (*tokens)
          for (int32_t id : ids)
            std::printf("%d\t%s\n", id, nlohmann::json(tok.id_to_token(id).value_or("")).dump().c_str());
        return 0;
      });
    });

const RegisterCommand detokenize_cmd(
    "detokenize", "Print the text of comma-separated token ids (debugging)", [](CLI::App& sub) {
      auto model = std::make_shared<std::string>();
      auto ids = std::make_shared<std::string>();
      auto skip = std::make_shared<bool>(false);
      sub.add_option("--model", *model, "Model directory with tokenizer.json")->required();
      sub.add_option("--ids", *ids, "Token ids, e.g. 1,2,3")->required();
      sub.add_flag("--skip-special", *skip, "Leave special tokens out");
      return std::function<int()>([=] {
        const Tokenizer tok = Tokenizer::from_dir(*model);
        const std::string text = tok.decode(parse_ids(*ids), *skip);
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::printf("\n");
        return 0;
      });
    });

const RegisterCommand chat_template_cmd(
    "chat-template", "Render a model's chat template for messages from a JSON file", [](CLI::App& sub) {
      auto model = std::make_shared<std::string>();
      auto file = std::make_shared<std::string>();
      auto no_gen = std::make_shared<bool>(false);
      auto thinking = std::make_shared<std::string>();
      sub.add_option("--model", *model, "Model directory with tokenizer_config.json")->required();
      sub.add_option("--messages", *file, "JSON file: an array of {role, content} messages")->required();
      sub.add_flag("--no-generation-prompt", *no_gen, "Do not append the assistant turn header");
      sub.add_option("--enable-thinking", *thinking, "true or false (left undefined when absent)")
          ->check(CLI::IsMember({"true", "false"}));
      return std::function<int()>([=] {
        const Tokenizer tok = Tokenizer::from_dir(*model);
        std::ifstream in(*file, std::ios::binary);
        if (!in) throw Error(*file + ": cannot open");
        nlohmann::ordered_json messages;
        try {
          messages = nlohmann::ordered_json::parse(in);
        } catch (const nlohmann::json::exception& e) {
          throw Error(*file + ": invalid JSON: " + e.what());
        }
        ChatOptions opts;
        opts.add_generation_prompt = !*no_gen;
        if (!thinking->empty()) opts.enable_thinking = *thinking == "true";
        const std::string prompt = tok.apply_chat_template(messages, opts);
        std::fwrite(prompt.data(), 1, prompt.size(), stdout);
        return 0;
      });
    });

}  // namespace
}  // namespace dflash::cli
