#pragma once
// HF normalizers the supported families use: Unicode normal forms (via utf8proc) and Sequence.
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace dflash {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string_view text) const = 0;
  // Null when the config is null (no normalization).
  static std::unique_ptr<Normalizer> from_json(const nlohmann::json& config,
                                               const std::string& where);
};

}  // namespace dflash
