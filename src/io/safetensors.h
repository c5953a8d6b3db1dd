#pragma once
// Memory-mapped safetensors files. The header is validated completely when a file is opened,
// so later code can trust every offset: a bad file fails here, with its name, never later
// with a crash.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "util/dtype.h"

namespace dflash {

struct TensorInfo {
  std::string name;
  std::string file;  // the safetensors file that holds it
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mapping
  size_t nbytes = 0;

  int64_t numel() const;
  std::string shape_str() const;
};

std::string shape_to_string(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  // Throws dflash::Error naming `path` for: a file that cannot be opened or is truncated, a
  // malformed header, an unsupported dtype, a shape that disagrees with its byte range, offsets
  // out of range or overlapping.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse(const uint8_t* bytes, size_t size);

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Parses a header already in memory (for fuzzing and tests); `data` spans the whole file.
std::map<std::string, TensorInfo> parse_safetensors(const uint8_t* data, size_t size,
                                                    const std::string& path);

}  // namespace dflash
