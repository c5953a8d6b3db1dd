#pragma once
// An error a client caused (or, for 5xx, one the server could not avoid), carried up to the
// HTTP layer and written in the OpenAI shape {"error": {"message", "type", "param", "code"}}.
#include <stdexcept>
#include <string>

namespace dflash::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, std::string code, std::string message, std::string param = {})
      : std::runtime_error(message), status(status), type(std::move(type)), code(std::move(code)),
        param(std::move(param)) {}
  int status;
  std::string type;   // invalid_request_error, rate_limit_error, service_unavailable, server_error
  std::string code;   // machine-readable reason; empty → null
  std::string param;  // the offending request field; empty → null
};

// 400 invalid_request_error naming the field.
inline ApiError bad_request(const std::string& message, const std::string& param = {},
                            const std::string& code = "invalid_value") {
  return ApiError(400, "invalid_request_error", code, message, param);
}

}  // namespace dflash::server
