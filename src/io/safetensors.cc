#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace dflash {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string TensorInfo::shape_str() const { return shape_to_string(shape); }

namespace {

bool parse_dtype(const std::string& s, DType* out) {
  if (s == "F32") *out = DType::F32;
  else if (s == "F16") *out = DType::F16;
  else if (s == "BF16") *out = DType::BF16;
  else return false;
  return true;
}


// The header may claim any size; cap it so a corrupt length cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

}  // namespace

std::map<std::string, TensorInfo> parse_safetensors(const uint8_t* bytes, size_t size,
                                                    const std::string& path) {
  if (size < 8) throw Error(path + ": truncated safetensors file (" + std::to_string(size) +
                            " bytes, the 8-byte header length is missing)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian on every platform we build for
  if (header_len > kMaxHeaderBytes)
    throw Error(path + ": malformed safetensors header: header length " +
                std::to_string(header_len) + " is implausible");
  if (8 + header_len > size)
    throw Error(path + ": truncated safetensors file: header claims " + std::to_string(header_len) +
                " bytes but the file has " + std::to_string(size - 8) + " after the length");
  const char* hdr = reinterpret_cast<const char*>(bytes + 8);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(hdr, hdr + header_len);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": malformed safetensors header: " + e.what());
  }
  if (!j.is_object()) throw Error(path + ": malformed safetensors header: not a JSON object");

  const uint8_t* data = bytes + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::map<std::string, TensorInfo> tensors;
  std::vector<std::pair<uint64_t, std::string>> ranges;  // begin offset → tensor, to find overlaps
  std::map<std::string, uint64_t> ends;

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const auto& e = it.value();
    const std::string where = path + ": tensor '" + printable(name) + "'";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      throw Error(where + ": malformed header entry (needs dtype, shape and data_offsets)");
    if (!e["dtype"].is_string()) throw Error(where + ": malformed header entry: dtype is not a string");
    TensorInfo t;
    t.name = name;
    t.file = path;
    const std::string dt = e["dtype"].get<std::string>();
    if (!parse_dtype(dt, &t.dtype))
      throw Error(where + ": unsupported dtype " + printable(dt) + " (supported: F32, F16, BF16)");
    if (!e["shape"].is_array()) throw Error(where + ": malformed header entry: shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        throw Error(where + ": malformed header entry: shape has a non-integer or negative size");
      t.shape.push_back(d.get<int64_t>());
      const uint64_t dim = static_cast<uint64_t>(t.shape.back());
      if (dim != 0 && numel > (uint64_t(1) << 50) / dim)
        throw Error(where + ": malformed header entry: shape " + t.shape_str() + " is too large");
      numel *= dim;
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      throw Error(where + ": malformed header entry: data_offsets must be two non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      throw Error(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  "] out of range (data section is " + std::to_string(data_size) + " bytes)");
    const uint64_t expected = numel * dtype_size(t.dtype);
    if (end - begin != expected)
      throw Error(where + ": shape " + t.shape_str() + " of " + dt + " needs " +
                  std::to_string(expected) + " bytes but data_offsets span " +
                  std::to_string(end - begin));
    t.data = data + begin;
    t.nbytes = end - begin;
    if (t.nbytes) ranges.emplace_back(begin, name);
    ends[name] = end;
    tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& prev = ranges[i - 1];
    if (ends[prev.second] > ranges[i].first)
      throw Error(path + ": tensors '" + printable(prev.second) + "' and '" + printable(ranges[i].second) +
                  "' have overlapping data_offsets");
  }
  return tensors;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(errno));
  }
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->mapping_size_ = static_cast<size_t>(st.st_size);
  if (f->mapping_size_ > 0) {
    f->mapping_ = mmap(nullptr, f->mapping_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->mapping_ == MAP_FAILED) {
      f->mapping_ = nullptr;
      ::close(fd);
      throw Error(path + ": cannot mmap: " + std::strerror(errno));
    }
  }
  ::close(fd);
  f->parse(static_cast<const uint8_t*>(f->mapping_), f->mapping_size_);
  return f;
}

void SafetensorsFile::parse(const uint8_t* bytes, size_t size) {
  tensors_ = parse_safetensors(bytes, size, path_);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  auto j = nlohmann::json::parse(reinterpret_cast<const char*>(bytes + 8),
                                 reinterpret_cast<const char*>(bytes + 8 + header_len));
  if (j.contains("__metadata__") && j["__metadata__"].is_object())
    for (auto it = j["__metadata__"].begin(); it != j["__metadata__"].end(); ++it)
      if (it.value().is_string()) metadata_[it.key()] = it.value().get<std::string>();
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) munmap(mapping_, mapping_size_);
}

}  // namespace dflash
