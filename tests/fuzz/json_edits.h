#pragma once
// Structure-aware inputs for the fuzzers of JSON files. Mutating raw bytes almost always breaks
// the JSON, so a loader's type and range checks are rarely reached; here the input is read as
// edits to a valid document instead: each 3 bytes put one value of a chosen kind (a string
// where an int belongs, 0, −1, an int past 32 bits, 1e300, a control character, …) at one of
// the document's known fields, or erase it.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dflash::fuzz {

inline nlohmann::json edit_value(uint8_t kind, uint8_t arg) {
  switch (kind % 16) {
    case 0: return nullptr;
    case 1: return static_cast<int8_t>(arg);
    case 2: return 0;
    case 3: return -1;
    case 4: return 4294967297LL;  // wraps to 1 as a 32-bit int
    case 5: return -4294967297LL;
    case 6: return 1e300;
    case 7: return 0.5;
    case 8: return std::to_string(arg);  // a number as a string
    case 9: return "a\nb\x01";
    case 10: return arg % 2 == 0;
    case 11: return nlohmann::json::array();
    case 12: return nlohmann::json::array({arg % 8, arg % 3});
    case 13: return nlohmann::json::object();
    case 14: return int64_t(arg) * 100000;
    default: return 1e-300;
  }
}

// Applies the edits in bytes [p, p + n) to `doc`; `fields` are JSON pointers ("/a/b/0"). A
// byte triple (field, kind, arg) with kind 255 erases the field. An edit whose path no longer
// exists as an object or array (an earlier edit replaced its parent) is skipped.
inline void apply_json_edits(nlohmann::json& doc, const std::vector<std::string>& fields, const uint8_t* p, size_t n) {
  for (size_t i = 0; i + 3 <= n; i += 3) {
    const nlohmann::json::json_pointer ptr(fields[p[i] % fields.size()]);
    try {
      if (p[i + 1] == 255) {
        nlohmann::json& parent = doc.at(ptr.parent_pointer());
        if (parent.is_object()) parent.erase(ptr.back());
      } else {
        doc[ptr] = edit_value(p[i + 1], p[i + 2]);
      }
    } catch (const nlohmann::json::exception&) {
      // the path is gone or crosses a non-container: skip this edit
    }
  }
}

}  // namespace dflash::fuzz
