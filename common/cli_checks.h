// Flag checks shared by the command-line tools (CLI11 validators). Header-only: included by
// the binaries' flag code, which links CLI11.
#ifndef KNNSERVE_COMMON_CLI_CHECKS_H_
#define KNNSERVE_COMMON_CLI_CHECKS_H_

#include <cmath>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace knnserve {

// A finite number in [min, max]. CLI::Range lets NaN through: every comparison with it is false.
inline CLI::Validator FiniteRange(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& input) -> std::string {
        double value = 0;
        if (!absl::SimpleAtod(input, &value) || !std::isfinite(value) || value < min ||
            value > max) {
          return absl::StrCat("'", input, "' is not a number in [", min, ", ", max, "]");
        }
        return "";
      },
      absl::StrCat("FLOAT in [", min, " - ", max, "]"));
}

// host:port (or :port) with a port in [0, 65535] (gRPC itself takes larger ports modulo 65536);
// also a gRPC unix: or unix-abstract: socket, a target URI (dns:///host[:port]), or empty
// (the flag's "off").
inline CLI::Validator HostPort() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        if (input.empty() || input.rfind("unix:", 0) == 0 ||
            input.rfind("unix-abstract:", 0) == 0 || input.find(":///") != std::string::npos) {
          return "";
        }
        const size_t colon = input.rfind(':');
        int port = -1;
        if (colon == std::string::npos || !absl::SimpleAtoi(input.substr(colon + 1), &port) ||
            port < 0 || port > 65535) {
          return absl::StrCat("'", input, "' is not host:port with a port in [0, 65535]");
        }
        return "";
      },
      "HOST:PORT");
}

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_CLI_CHECKS_H_
