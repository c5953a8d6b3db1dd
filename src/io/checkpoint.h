#pragma once
// A Hugging Face model directory: config.json plus one safetensors file or shards listed in
// model.safetensors.index.json. Models take tensors by name and expected shape; anything
// missing, misshapen or left over is reported with the file and tensor named.
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace dflash {

// Reads and parses a JSON file; errors name the file and the position.
nlohmann::json read_json_file(const std::string& path);

class Checkpoint {
 public:
  // A drafter may be published without config.json; `inspect` opens it with require_config false.
  static Checkpoint open(const std::string& dir, bool require_config = true);
  bool has_config() const { return has_config_; }

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  const std::string& config_path() const { return config_path_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }

  // The tensor `name` with exactly `shape`; marks it as used.
  const TensorInfo& get(const std::string& name, const std::vector<int64_t>& shape);
  // Without a shape check (callers that infer shapes, like `inspect`).
  const TensorInfo& peek(const std::string& name) const;
  std::vector<std::string> names() const;

  // Throws if any tensor was never taken by get(): an unexpected tensor means the
  // checkpoint is not the architecture we think it is.
  void check_all_used() const;

 private:
  std::string dir_;
  std::string config_path_;
  nlohmann::json config_;
  bool has_config_ = false;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
  std::set<std::string> used_;
};

}  // namespace dflash
