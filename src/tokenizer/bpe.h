#pragma once
// Byte-level BPE model (HF tokenizers' "BPE" with a ByteLevel pre-tokenizer): vocab and merges
// are translated to raw bytes at load time, so encoding works on the input bytes directly.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dflash {

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object; `file` names it in error messages.
  void load(const nlohmann::json& model, const std::string& file);

  // Appends the ids of one pre-tokenized piece (raw bytes) to `out`.
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

  // The raw bytes a vocab id stands for (empty for ids outside the vocab).
  const std::string& id_bytes(int32_t id) const;
  // The vocab string as written in tokenizer.json.
  const std::string& id_token(int32_t id) const;
  int32_t token_id(std::string_view token) const;  // -1 if absent
  size_t size() const { return id_to_token_.size(); }

 private:
  struct MergeTable {
    // Open addressing keyed by the (left, right) id pair: the hot loop of BPE.
    std::vector<uint64_t> keys;
    std::vector<uint64_t> values;  // rank << 32 | merged id
    uint64_t mask = 0;
    void build(const std::vector<std::pair<uint64_t, uint64_t>>& entries);
    bool find(uint64_t key, uint32_t* rank, int32_t* merged) const;
  };

  void merge_word(std::string_view bytes, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> token_to_id_;  // tokenizer.json spelling
  std::unordered_map<std::string, int32_t> bytes_to_id_;  // raw bytes
  std::vector<std::string> id_to_token_;
  std::vector<std::string> id_to_bytes_;
  int32_t byte_id_[256];
  MergeTable merges_;
  bool ignore_merges_ = false;
};

}  // namespace dflash
