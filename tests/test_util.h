#pragma once
// Helpers shared by the engine tests: paths, temporary directories, synthetic checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/error.h"

namespace dflash::test {

inline std::string source_path(const std::string& rel) { return std::string(DFLASH_SOURCE_DIR) + "/" + rel; }
inline std::string tiny(const std::string& name) { return source_path("testdata/tiny/" + name); }

// A fresh directory under the build tree, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = std::filesystem::path(DFLASH_BINARY_DIR) / "tmp" /
            (tag + "-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
             std::to_string(reinterpret_cast<uintptr_t>(this)));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A safetensors file from a header JSON and a data section.
inline std::string safetensors_bytes(const nlohmann::json& header, const std::string& data) {
  const std::string h = header.dump();
  uint64_t n = h.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + h + data;
}

// Runs `f` and returns the dflash::Error message it threw; fails the test if none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const dflash::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a dflash::Error";
  return "";
}

// Max |a − b| over max |b|: the tolerance measure for f32 logits.
inline double relative_max_error(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, double(std::abs(a[i] - b[i])));
    scale = std::max(scale, double(std::abs(b[i])));
  }
  return err / scale;
}

inline void copy_dir(const std::string& from, const std::string& to) {
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
}

}  // namespace dflash::test
