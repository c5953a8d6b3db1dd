#pragma once
// The DFlash drafter: a few Qwen3-style layers that read the target's context features and
// propose a whole block in one pass (contract sections 2–4). It owns no embedding and no LM
// head; it borrows the target's.
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/qwen3.h"

namespace dflash {

// Reads a drafter's config.json, filling what it leaves out from the tensor shapes (and the
// documented defaults for what shapes cannot tell), and recording each filled field in
// `guessed`. `target` supplies the number of target layers and RoPE. Shared with `inspect`.
DrafterConfig infer_drafter_config(const Checkpoint& ckpt, const Qwen3Config& target,
                                   int target_token_count);

// The publisher's default when a config gives no target_layer_ids (contract section 3).
std::vector<int> default_target_layer_ids(int num_target_layers, int k);

// Every check of a drafter against its target; empty when the pair is sound.
struct PairingCheck {
  std::string what;    // "hidden size", "mask token id", …
  bool ok;
  std::string detail;  // expected against actual
};
std::vector<PairingCheck> check_pairing(const DrafterConfig& d, const Checkpoint& drafter_ckpt,
                                        const Qwen3Config& target, int target_token_count);

// Number of real token ids the target's tokenizer defines (ids 0 … n−1), read from
// tokenizer.json in the target's directory; 0 when the directory has no tokenizer.
int tokenizer_token_count(const std::string& target_dir);

class DFlashDrafter {
 public:
  // Throws on the first failed pairing check; `warnings` receives the guessed fields.
  static std::unique_ptr<DFlashDrafter> load(const std::string& dir, const Qwen3Model& target,
                                             std::vector<std::string>* warnings = nullptr);

  const DrafterConfig& config() const { return config_; }
  // Weight bytes one drafting step has to read: the drafter's layers, fc and norms, and the
  // target's LM head again (borrowed for the block's logits). add_context reads the layers' k/v
  // weights a second time (context_kv_proj_ is a copy of them, stacked for one product), but a
  // step that projected its context rows with its block rows would read them once, so this
  // floor counts them once (until 2026-12-03 it counted them twice: at Qwen3-8B shapes a
  // roofline 0.45 % longer).
  int64_t weight_bytes_per_step() const;
  SequenceState new_sequence(int64_t capacity) const;

  // Appends the context rows for `features` (the target's features of positions
  // state.length() …) to the drafter's cache, where they stay.
  void add_context(SequenceState& state, const Tensor& features);
  // Drafts the block [anchor, MASK × (B−1)] at positions state.length() …; returns the
  // logits of block rows 1 … rows−1 (rows ≤ B; 0 means all B). The state is left as it was.
  // A drafter predicts best with the block it was trained on, so the engine drafts whole
  // blocks and verifies only as many rows as pay. With `greedy_ids` (I32 [rows − 1, 1]) it
  // writes those rows' argmax there instead and returns no logits (Qwen3Model::forward).
  Tensor draft(SequenceState& state, int32_t anchor, int block_size, int rows = 0, Tensor* greedy_ids = nullptr);

 private:
  DFlashDrafter(const Qwen3Model& target) : target_(target) {}
  const Qwen3Model& target_;
  DrafterConfig config_;
  RopeTable rope_;
  Tensor fc_, hidden_norm_, final_norm_;
  // Every layer's k_proj then v_proj rows, layer after layer: the context rows are the same
  // for all layers (hidden_norm(fc(features))), so one product projects them for all of them.
  Tensor context_kv_proj_;
  std::vector<DecoderLayerWeights> layers_;
};

}  // namespace dflash
