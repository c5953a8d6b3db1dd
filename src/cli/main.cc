// dflash: a thin command-line tool over the engine library. Subcommands live in cmd_*.cc.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/command.h"
#include "util/error.h"

namespace dflash::cli {
std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> registry;
  return registry;
}
}  // namespace dflash::cli

int main(int argc, char** argv) {
  // OpenMP threads that spin while idle starve whatever shares the cores (a second request,
  // the OS, the other half of a 2-core machine), and libgomp reads its wait policy only when
  // it loads: so set it and start again, once, unless the user chose a policy.
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // returns only on failure; then run as we are
  }
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
