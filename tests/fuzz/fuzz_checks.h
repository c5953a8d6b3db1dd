#pragma once
// What the fuzz targets assert with. A failed invariant aborts, which libFuzzer reports as a
// crash and keeps the input that caused it.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "util/error.h"

namespace dflash::fuzz {

inline void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz check failed: %s\n", what);
    std::abort();
  }
}

// Errors end up in logs and on terminals line by line; a newline smuggled in through a name or
// a field would forge extra lines.
inline void check_one_line(const Error& e) {
  const std::string m = e.what();
  check(!m.empty(), "empty error message");
  check(m.find('\n') == std::string::npos && m.find('\r') == std::string::npos, "multi-line error message");
}

}  // namespace dflash::fuzz
