#include "tokenizer/bpe.h"

#include <nlohmann/json.hpp>
#include <queue>

#include "tokenizer/byte_level.h"
#include "util/error.h"

namespace dflash {
namespace {

constexpr uint64_t kEmpty = ~uint64_t{0};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

void BpeModel::MergeTable::build(const std::vector<std::pair<uint64_t, uint64_t>>& entries) {
  size_t cap = 16;
  while (cap < entries.size() * 2) cap <<= 1;
  keys.assign(cap, kEmpty);
  values.assign(cap, 0);
  mask = cap - 1;
  for (const auto& [k, v] : entries) {
    uint64_t h = mix(k) & mask;
    while (keys[h] != kEmpty && keys[h] != k) h = (h + 1) & mask;
    if (keys[h] == k) continue;  // duplicate merge: the first (lowest rank) wins, as in HF
    keys[h] = k;
    values[h] = v;
  }
}

bool BpeModel::MergeTable::find(uint64_t key, uint32_t* rank, int32_t* merged) const {
  uint64_t h = mix(key) & mask;
  while (true) {
    const uint64_t k = keys[h];
    if (k == key) {
      *rank = static_cast<uint32_t>(values[h] >> 32);
      *merged = static_cast<int32_t>(values[h] & 0xffffffffu);
      return true;
    }
    if (k == kEmpty) return false;
    h = (h + 1) & mask;
  }
}

void BpeModel::load(const nlohmann::json& model, const std::string& file) {
  using nlohmann::json;
  const std::string where = file + ": model";
  if (!model.is_object()) throw Error(where + ": expected an object");
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") throw Error(where + ".type: unsupported model type '" + type + "'");
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(field);
    if (it != model.end() && it->is_string() && !it->get<std::string>().empty())
      throw Error(where + "." + field + ": unsupported (only byte-level BPE is supported)");
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null() && it->get<double>() > 0)
    throw Error(where + ".dropout: BPE dropout is not supported");
  ignore_merges_ = model.value("ignore_merges", false);

  auto vit = model.find("vocab");
  if (vit == model.end() || !vit->is_object()) throw Error(where + ".vocab: missing or not an object");
  int32_t max_id = -1;
  for (const auto& [tok, idv] : vit->items()) {
    if (!idv.is_number_integer() || idv.get<int64_t>() < 0 || idv.get<int64_t>() > INT32_MAX)
      throw Error(where + ".vocab[\"" + tok + "\"]: id must be a non-negative integer");
    max_id = std::max(max_id, idv.get<int32_t>());
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  id_to_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  token_to_id_.reserve(vit->size());
  bytes_to_id_.reserve(vit->size());
  for (const auto& [tok, idv] : vit->items()) {
    const int32_t id = idv.get<int32_t>();
    id_to_token_[id] = tok;
    id_to_bytes_[id] = byte_level::token_bytes(tok);
    token_to_id_.emplace(tok, id);
    bytes_to_id_.emplace(id_to_bytes_[id], id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    byte_id_[b] = it == bytes_to_id_.end() ? -1 : it->second;
  }

  auto mit = model.find("merges");
  if (mit == model.end() || !mit->is_array()) throw Error(where + ".merges: missing or not an array");
  std::vector<std::pair<uint64_t, uint64_t>> entries;
  entries.reserve(mit->size());
  uint32_t rank = 0;
  for (const auto& m : *mit) {
    const std::string at = where + ".merges[" + std::to_string(rank) + "]";
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw Error(at + ": expected \"left right\", got \"" + s + "\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      throw Error(at + ": expected a string or a pair of strings");
    }
    auto ia = token_to_id_.find(a), ib = token_to_id_.find(b), ic = token_to_id_.find(a + b);
    if (ia == token_to_id_.end()) throw Error(at + ": token \"" + a + "\" is not in the vocab");
    if (ib == token_to_id_.end()) throw Error(at + ": token \"" + b + "\" is not in the vocab");
    if (ic == token_to_id_.end())
      throw Error(at + ": merged token \"" + a + b + "\" is not in the vocab");
    entries.emplace_back(pair_key(ia->second, ib->second),
                         (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(ic->second));
    ++rank;
  }
  merges_.build(entries);
}

const std::string& BpeModel::id_bytes(int32_t id) const {
  static const std::string empty;
  if (id < 0 || static_cast<size_t>(id) >= id_to_bytes_.size()) return empty;
  return id_to_bytes_[id];
}

const std::string& BpeModel::id_token(int32_t id) const {
  static const std::string empty;
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return empty;
  return id_to_token_[id];
}

int32_t BpeModel::token_id(std::string_view token) const {
  auto it = token_to_id_.find(std::string(token));
  return it == token_to_id_.end() ? -1 : it->second;
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (bytes.size() == 1) {
    const int32_t id = byte_id_[static_cast<unsigned char>(bytes[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (ignore_merges_) {
    auto it = bytes_to_id_.find(std::string(bytes));
    if (it != bytes_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  merge_word(bytes, out);
}

void BpeModel::merge_word(std::string_view bytes, std::vector<int32_t>& out) const {
  // Always apply the lowest-rank merge, leftmost first (HF's priority queue order); stale
  // queue entries are detected by re-checking the symbols they refer to.
  struct Sym {
    int32_t id;
    int32_t prev, next;
  };
  struct Cand {
    uint32_t rank;
    int32_t pos;  // index of the left symbol; left-to-right order equals index order
    int32_t left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Sym> syms;
  syms.reserve(bytes.size());
  for (unsigned char c : bytes) {
    const int32_t id = byte_id_[c];
    if (id < 0) continue;  // no vocab entry and no unk token: HF drops the byte
    const int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back({id, idx - 1, idx + 1});
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue;
  auto consider = [&](int32_t pos) {
    const int32_t nxt = syms[pos].next;
    if (nxt < 0) return;
    uint32_t rank;
    int32_t merged;
    if (merges_.find(pair_key(syms[pos].id, syms[nxt].id), &rank, &merged))
      queue.push({rank, pos, syms[pos].id, syms[nxt].id, merged});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Cand c = queue.top();
    queue.pop();
    Sym& left = syms[c.pos];
    if (left.id != c.left || left.next < 0) continue;
    Sym& right = syms[left.next];
    if (right.id != c.right) continue;
    // Merge: the left symbol absorbs the right one.
    left.id = c.merged;
    left.next = right.next;
    right.id = -1;
    if (left.next >= 0) syms[left.next].prev = c.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace dflash
