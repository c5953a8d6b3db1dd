// dflash inspect: what a checkpoint holds and whether its config.json agrees with its tensors;
// with --draft and --target, whether a drafter fits a target; with --write-config, a config.json
// for a drafter published without one. Reads headers only (model/inspect.h).
#include <cstdio>
#include <sstream>

#include "cli/command.h"
#include "cli/validators.h"
#include "model/inspect.h"
#include "util/error.h"

namespace dflash::cli {
namespace {

struct InspectArgs {
  std::string dir;
  std::string draft_dir;
  std::string target_dir;
  std::string write_config;
  std::string target_layer_ids;  // comma-separated
  int mask_token_id = -1;
  int block_size = 0;
  bool json = false;
  bool no_tensors = false;
};

std::vector<int> parse_ids(const std::string& csv) {
  std::vector<int> out;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0)
      throw Error("--target-layer-ids: '" + item + "' is not a non-negative integer (expected e.g. 1,9,17,25,33)");
    out.push_back(v);
  }
  if (out.empty()) throw Error("--target-layer-ids: empty list");
  return out;
}

int run_inspect(const InspectArgs& a) {
  InspectOptions opt;
  opt.target_dir = a.target_dir;
  if (!a.target_layer_ids.empty()) opt.target_layer_ids = parse_ids(a.target_layer_ids);
  if (a.mask_token_id >= 0) opt.mask_token_id = a.mask_token_id;
  if (a.block_size > 0) opt.block_size = a.block_size;
  if (!a.dir.empty() && !a.draft_dir.empty() && a.dir != a.draft_dir)
    throw Error("inspect: give the drafter either as DIR or as --draft, not both");
  const std::string subject = a.dir.empty() ? a.draft_dir : a.dir;
  if (subject.empty()) throw Error("inspect: nothing to inspect (give DIR, or --draft D --target T)");

  if (!a.write_config.empty()) {
    write_drafter_config(subject, opt, a.write_config);
    std::fprintf(stderr, "wrote %s\n", a.write_config.c_str());
  }
  // A pairing report when a target is given for a drafter (always when --draft is used).
  InspectReport report = inspect_checkpoint(subject, opt);
  const bool pairing = !a.target_dir.empty() && (report.kind == ModelKind::DFlashDrafter || !a.draft_dir.empty());
  if (pairing) {
    PairingReport p = inspect_pairing(subject, a.target_dir, opt);
    if (a.json) {
      nlohmann::ordered_json j;
      j["drafter"] = report.to_json(!a.no_tensors);
      j["pairing"] = p.to_json();
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("%s\n%s", report.to_text(!a.no_tensors).c_str(), p.to_text().c_str());
    }
    return p.ok() ? 0 : 1;
  }
  if (a.json) std::printf("%s\n", report.to_json(!a.no_tensors).dump(2).c_str());
  else std::printf("%s", report.to_text(!a.no_tensors).c_str());
  return report.ok() ? 0 : 1;
}

RegisterCommand reg("inspect",
                    "Describe a checkpoint (tensors, dtypes, config agreement), check a drafter against a target, "
                    "or write a drafter's missing config.json",
                    [](CLI::App& sub) -> std::function<int()> {
  auto a = std::make_shared<InspectArgs>();
  sub.add_option("dir", a->dir, "Model directory (a Qwen3 target or a DFlash drafter)");
  sub.add_option("-d,--draft", a->draft_dir, "DFlash drafter directory (with --target: pairing report)");
  sub.add_option("-t,--target", a->target_dir, "Target model directory the drafter is meant for");
  sub.add_option("--write-config", a->write_config,
                 "Write a config.json for the drafter (needs --target); guessed fields are listed in it");
  sub.add_option("--target-layer-ids", a->target_layer_ids, "Known target_layer_ids, e.g. 1,9,17,25,33");
  sub.add_option("--mask-token-id", a->mask_token_id, "Known mask_token_id")->check(non_negative());
  sub.add_option("--block-size", a->block_size, "Known block_size")->check(CLI::Range(2, 64));
  sub.add_flag("--json", a->json, "Print JSON instead of text");
  sub.add_flag("--no-tensors", a->no_tensors, "Leave out the per-tensor table");
  return [a] { return run_inspect(*a); };
});

}  // namespace
}  // namespace dflash::cli
