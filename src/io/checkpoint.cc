#include "io/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace fs = std::filesystem;

namespace dflash {

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": malformed JSON: " + e.what());
  }
}

Checkpoint Checkpoint::open(const std::string& dir, bool require_config) {
  Checkpoint c;
  c.dir_ = dir;
  if (!fs::is_directory(dir)) throw Error(dir + ": not a model directory");
  c.config_path_ = (fs::path(dir) / "config.json").string();
  c.has_config_ = fs::exists(c.config_path_);
  if (c.has_config_) {
    c.config_ = read_json_file(c.config_path_);
    if (!c.config_.is_object()) throw Error(c.config_path_ + ": expected a JSON object");
  } else if (require_config) {
    throw Error(c.config_path_ + ": missing (every model directory needs config.json)");
  } else {
    c.config_ = nlohmann::json::object();
  }

  std::vector<std::string> shard_files;
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index_path)) {
    auto idx = read_json_file(index_path.string());
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      throw Error(index_path.string() + ": missing field 'weight_map'");
    std::set<std::string> files;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw Error(index_path.string() + ": weight_map['" + it.key() + "'] is not a file name");
      weight_map[it.key()] = it.value().get<std::string>();
      files.insert(it.value().get<std::string>());
    }
    shard_files.assign(files.begin(), files.end());
  } else if (fs::exists(single)) {
    shard_files.push_back("model.safetensors");
  } else {
    // Drafters are sometimes published under another single-file name.
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shard_files.push_back(e.path().filename().string());
    std::sort(shard_files.begin(), shard_files.end());
    if (shard_files.empty()) throw Error(dir + ": no *.safetensors file and no model.safetensors.index.json");
  }
  for (const auto& f : shard_files) {
    const std::string p = (fs::path(dir) / f).string();
    if (!fs::exists(p)) throw Error(p + ": listed in model.safetensors.index.json but missing");
    c.files_.push_back(SafetensorsFile::open(p));
  }
  for (const auto& file : c.files_) {
    for (const auto& [name, info] : file->tensors()) {
      if (c.index_.count(name))
        throw Error(file->path() + ": tensor '" + name + "' also appears in " + c.index_[name]->file);
      if (!weight_map.empty()) {
        auto it = weight_map.find(name);
        const std::string base = fs::path(file->path()).filename().string();
        if (it == weight_map.end())
          throw Error(file->path() + ": tensor '" + name + "' is not listed in model.safetensors.index.json");
        if (it->second != base)
          throw Error(index_path.string() + ": tensor '" + name + "' is listed in " + it->second +
                      " but stored in " + base);
      }
      c.index_[name] = &info;
    }
  }
  for (const auto& [name, file] : weight_map)
    if (!c.index_.count(name))
      throw Error((fs::path(dir) / file).string() + ": tensor '" + name +
                  "' listed in model.safetensors.index.json is missing from the file");
  return c;
}

const TensorInfo& Checkpoint::peek(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error(dir_ + ": missing tensor '" + name + "'");
  return *it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name, const std::vector<int64_t>& shape) {
  const TensorInfo& t = peek(name);
  if (t.shape != shape)
    throw Error(t.file + ": tensor '" + name + "' has shape " + t.shape_str() + ", expected " +
                shape_to_string(shape));
  used_.insert(name);
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [n, _] : index_) out.push_back(n);
  return out;
}

void Checkpoint::check_all_used() const {
  for (const auto& [name, info] : index_)
    if (!used_.count(name)) throw Error(info->file + ": unexpected tensor '" + name + "'");
}

}  // namespace dflash
