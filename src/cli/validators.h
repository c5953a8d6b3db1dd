#pragma once
// Option checks whose refusals say what the option needs. CLI11's PositiveNumber and
// NonNegativeNumber refuse 0 as "not in range 0.000000 to" a 309-digit number; these say
// "--max-new-tokens: must be greater than 0, got 0".
#include <CLI/CLI.hpp>
#include <string>

namespace dflash::cli {

inline CLI::Validator number_check(const char* need, bool (*ok)(double)) {
  return CLI::Validator(
      [need, ok](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not a number";
        return ok(v) ? std::string() : std::string("must be ") + need + ", got " + text;
      },
      need);
}

inline CLI::Validator positive() {
  return number_check("greater than 0", [](double v) { return v > 0; });
}

inline CLI::Validator non_negative() {
  return number_check("0 or more", [](double v) { return v >= 0; });
}

}  // namespace dflash::cli
