#pragma once
// `dflash inspect`: what a checkpoint directory holds and whether its config.json agrees with
// its tensors, for Qwen3 targets and DFlash drafters; a drafter-against-target pairing report;
// and a config.json rebuilt for a drafter published without one. Only safetensors headers and
// JSON files are read: tensor data stays untouched in the mapping, so a 32B checkpoint
// inspects as fast as a tiny one.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/config.h"
#include "util/dtype.h"

namespace dflash {

struct InspectTensor {
  std::string name;
  std::string file;  // file name inside the directory (shards differ)
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  int64_t numel() const;
};

struct InspectDtype {
  DType dtype = DType::F32;
  int64_t tensors = 0;
  int64_t parameters = 0;
  uint64_t bytes = 0;
};

// One tensor where the config and the checkpoint disagree.
struct ShapeFinding {
  enum class Kind { Missing, Mismatch, Unexpected };
  Kind kind = Kind::Missing;
  std::string name;
  std::vector<int64_t> expected;  // from the config (empty for Unexpected)
  std::vector<int64_t> actual;    // in the checkpoint (empty for Missing)
  std::string describe() const;
};

struct ConfigAgreement {
  bool checked = false;  // false: nothing to compare (no config, unknown architecture)
  std::string error;     // the config itself could not be read or validated
  std::string note;      // why nothing was checked, when it was not
  int expected_tensors = 0;
  std::vector<ShapeFinding> findings;
  bool ok() const { return checked && error.empty() && findings.empty(); }
};

enum class ModelKind { Qwen3Target, DFlashDrafter, Unknown };
const char* model_kind_name(ModelKind k);

// A drafter config field, its value and where the value came from.
struct DrafterField {
  std::string name;
  nlohmann::json value;  // null when unknown
  // "config.json", "shapes", "target", "option" (given on the command line), "default"
  // (the publisher's default, contract section 3) or "unknown".
  std::string source;
  std::string note;
};

struct DrafterInspection {
  std::string target_dir;  // empty: inspected without a target
  int64_t fc_rows = 0, fc_cols = 0;
  // The target hidden size used to split fc's input: the real one with a target, else the
  // drafter's own (an assumption, stated in `k_note`).
  int64_t target_hidden = 0;
  int k = 0;            // fc_cols / target_hidden; 0 when it does not divide
  std::string k_note;
  std::vector<DrafterField> fields;
  // Fields a config.json written by --write-config marked as guessed.
  std::vector<std::string> config_guessed_fields;
  bool config_valid = false;  // `config` below is meaningful
  DrafterConfig config;
};

struct InspectReport {
  std::string dir;
  ModelKind kind = ModelKind::Unknown;
  std::string architecture;  // as config.json states it, or inferred
  bool has_config = false;
  std::vector<std::string> files;
  std::vector<InspectTensor> tensors;  // sorted by name
  std::vector<InspectDtype> dtypes;
  int64_t parameters = 0;
  uint64_t bytes = 0;
  std::optional<Qwen3Config> target_config;
  ConfigAgreement agreement;
  std::optional<DrafterInspection> drafter;

  // Config agrees with the tensors (or there was nothing to check it against).
  bool ok() const { return agreement.ok() || (!agreement.checked && agreement.error.empty()); }
  nlohmann::ordered_json to_json(bool with_tensors = true) const;
  std::string to_text(bool with_tensors = true) const;
};

// What the user knows that the checkpoint does not say.
struct InspectOptions {
  std::string target_dir;  // a drafter's target: gives K, vocabulary, RoPE, mask id
  std::optional<std::vector<int>> target_layer_ids;
  std::optional<int> mask_token_id;
  std::optional<int> block_size;
};

// Throws dflash::Error only when the directory cannot be read as a checkpoint at all; every
// disagreement inside it is reported, not thrown.
InspectReport inspect_checkpoint(const std::string& dir, const InspectOptions& opt = {});

struct PairingLine {
  enum class Status { Pass, Warn, Fail };
  std::string what;
  Status status = Status::Pass;
  std::string detail;
};
const char* pairing_status_name(PairingLine::Status s);

struct PairingReport {
  std::string draft_dir, target_dir;
  std::vector<PairingLine> lines;
  bool ok() const;  // no FAIL
  nlohmann::ordered_json to_json() const;
  std::string to_text() const;
};

// Every check of `draft_dir` against `target_dir` (model/dflash_drafter.h check_pairing,
// plus checkpoint agreement and dtypes); never throws for a mismatched pair.
PairingReport inspect_pairing(const std::string& draft_dir, const std::string& target_dir,
                              const InspectOptions& opt = {});

// A complete config.json for the drafter in `draft_dir` against `opt.target_dir` (required),
// with `dflash_guessed_fields` listing the fields neither the checkpoint, the target nor the
// options determine. Throws when a field cannot even be guessed (mask_token_id without a
// target tokenizer: pass opt.mask_token_id).
nlohmann::ordered_json drafter_config_json(const std::string& draft_dir, const InspectOptions& opt);
void write_drafter_config(const std::string& draft_dir, const InspectOptions& opt, const std::string& out_path);

}  // namespace dflash
