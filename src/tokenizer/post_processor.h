#pragma once
// HF post-processors reduced to what single-sequence encoding needs: the ids added before and
// after the sequence when add_special_tokens is on (TemplateProcessing, e.g. Llama 3.1's BOS).
// ByteLevel post-processing only adjusts offsets, which we do not produce.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dflash {

struct PostProcessor {
  std::vector<int32_t> prefix, suffix;
  void load(const nlohmann::json& config, const std::string& where);
};

}  // namespace dflash
