#pragma once
// Every error a user can cause is a dflash::Error with a one-line message that names the
// file, field or tensor involved. Tools catch it at the top and print it; nothing aborts.
#include <cstdio>
#include <stdexcept>
#include <string>

namespace dflash {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Text from a file (a tensor name, a rope_type) quoted in an error: control characters are
// shown escaped, so they can neither split the one-line message nor forge lines in a log.
inline std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace dflash
