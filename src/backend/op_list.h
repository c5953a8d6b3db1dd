#pragma once
// The measuring knobs that name ops by launch name (DFLASH_CUDA_NOOP, DFLASH_CUDA_PDL_SKIP):
// a comma-separated list in which an item names one op, or, ending in '*', every op whose name
// starts with what comes before it. One op can launch under several names (the split attention
// is `attention_decode`, `attention_block` or `attention` by shape and carveout); a list that
// named only `attention` once left the split running while a measurement took it as gone
// (docs/benchmarks.md, forty-second pass), so `attention*` names them all.
#include <string_view>

namespace dflash {

inline bool op_in_list(std::string_view list, std::string_view op) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (item.empty()) continue;
    if (item.back() == '*' ? op.substr(0, item.size() - 1) == item.substr(0, item.size() - 1) : op == item) return true;
  }
  return false;
}

}  // namespace dflash
