// dflash: a thin command-line tool over the engine library. Subcommands live in cmd_*.cc.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/command.h"
#include "util/error.h"
#include "util/runtime_env.h"

namespace dflash::cli {
std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> registry;
  return registry;
}
}  // namespace dflash::cli

int main(int argc, char** argv) {
  dflash::reexec_with_runtime_env(argv);
  using namespace dflash::cli;
  CLI::App app{"dflash: DFlash speculative decoding engine"};
  app.require_subcommand(1);
  auto& registry = command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const CommandInfo& a, const CommandInfo& b) { return a.name < b.name; });
  std::function<int()> action;
  std::vector<std::pair<CLI::App*, std::function<int()>>> actions;
  for (auto& info : registry) {
    CLI::App* sub = app.add_subcommand(info.name, info.description);
    actions.emplace_back(sub, info.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : actions)
      if (sub->parsed()) return run();
  } catch (const dflash::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
