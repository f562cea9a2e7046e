// Checks of gRPC addresses given by users (flags, shard maps). Header-only.
#ifndef KNNSERVE_COMMON_ADDRESS_H_
#define KNNSERVE_COMMON_ADDRESS_H_

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace knnserve {

// Whether `address` names a gRPC unix: or unix-abstract: socket (no host, no port).
inline bool IsUnixSocketAddress(absl::string_view address) {
  return absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:");
}

// OK for host:port (or :port) with a port in [min_port, 65535], a gRPC unix: or unix-abstract:
// socket, or a target URI (dns:///host[:port]); INVALID_ARGUMENT naming `address` otherwise.
// gRPC itself takes larger ports modulo 65536, i.e. dials another port than the one written.
inline absl::Status CheckAddress(absl::string_view address, int min_port) {
  if (IsUnixSocketAddress(address) || absl::StrContains(address, ":///")) {
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < min_port || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not host:port with a port in [", min_port, ", 65535]"));
  }
  return absl::OkStatus();
}

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_ADDRESS_H_
