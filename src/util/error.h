#pragma once
// Every error a user can cause is a dflash::Error with a one-line message that names the
// file, field or tensor involved. Tools catch it at the top and print it; nothing aborts.
#include <stdexcept>
#include <string>

namespace dflash {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace dflash
