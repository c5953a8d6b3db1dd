#pragma once
// Subcommands register themselves here, so each lives in its own file (cmd_*.cc) and main.cc
// never changes when one is added.
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace dflash::cli {

// `setup` adds the subcommand's options to `sub` and returns the action that runs it;
// the action returns the process exit code.
using CommandSetup = std::function<std::function<int()>(CLI::App& sub)>;

struct CommandInfo {
  std::string name;
  std::string description;
  CommandSetup setup;
};

std::vector<CommandInfo>& command_registry();

struct RegisterCommand {
  RegisterCommand(std::string name, std::string description, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace dflash::cli
