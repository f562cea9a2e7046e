// Flag checks shared by the command-line tools (CLI11 validators). Header-only: included by
// the binaries' flag code, which links CLI11.
#ifndef KNNSERVE_COMMON_CLI_CHECKS_H_
#define KNNSERVE_COMMON_CLI_CHECKS_H_

#include <cmath>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/address.h"

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

// An address to listen on (CheckAddress, port 0: any free one), or empty (the flag's "off").
inline CLI::Validator HostPort() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        if (input.empty()) return "";
        const absl::Status status = CheckAddress(input, /*min_port=*/0);
        return status.ok() ? "" : std::string(status.message());
      },
      "HOST:PORT");
}

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_CLI_CHECKS_H_
