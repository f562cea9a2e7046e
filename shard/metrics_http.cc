#include "shard/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace knnserve {
namespace {

constexpr int kPollMillis = 100;
constexpr size_t kMaxRequestBytes = 8192;
constexpr absl::Duration kConnectionTime = absl::Seconds(2);

absl::StatusOr<sockaddr_in> ParseAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.empty() || host == "localhost") host = "127.0.0.1";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "': host is not an IPv4 address"));
  }
  return addr;
}

// Waits until `fd` is ready for `events`, in slices that notice `stop`; false at `deadline` or
// on stop.
bool WaitReady(int fd, short events, absl::Time deadline, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd pfd{fd, events, 0};
    const int millis =
        static_cast<int>(std::min<int64_t>(kPollMillis, absl::ToInt64Milliseconds(left) + 1));
    const int ready = ::poll(&pfd, 1, millis);
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, const MetricsRegistry* registry) {
  auto addr = ParseAddress(address);
  if (!addr.ok()) return addr.status();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0 ||
      ::listen(fd, 16) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, ": ", std::strerror(err)));
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, ntohs(bound.sin_port), registry));
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::StartUnlessEmpty(
    const std::string& address, const MetricsRegistry* registry) {
  if (address.empty()) return std::unique_ptr<MetricsHttpServer>();
  return Start(address, registry);
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int port, const MetricsRegistry* registry)
    : listen_fd_(listen_fd), port_(port), registry_(registry), thread_([this] { Serve(); }) {}

MetricsHttpServer::~MetricsHttpServer() {
  stop_.store(true);
  thread_.join();
  ::close(listen_fd_);
}

void MetricsHttpServer::Serve() {
  while (!stop_.load()) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, kPollMillis) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors, the pending connection stays and poll reports it at once: wait.
      if (errno == EMFILE || errno == ENFILE) absl::SleepFor(absl::Milliseconds(kPollMillis));
      continue;
    }
    HandleConnection(fd);
    ::close(fd);
  }
}

// One thread serves every connection: each gets kConnectionTime in all, to send its request and
// to take the answer, so a client that trickles bytes or never reads holds the thread (and the
// destructor, which joins it) no longer than that.
void MetricsHttpServer::HandleConnection(int fd) {
  const absl::Time deadline = absl::Now() + kConnectionTime;
  std::string request;
  char buffer[1024];
  while (request.size() < kMaxRequestBytes && !absl::StrContains(request, "\r\n\r\n")) {
    if (!WaitReady(fd, POLLIN, deadline, stop_)) return;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    request.append(buffer, n);
  }
  const bool is_metrics =
      absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET / ");
  const std::string body = is_metrics ? registry_->RenderText() : "not found\n";
  const std::string reply =
      absl::StrCat("HTTP/1.0 ", is_metrics ? "200 OK" : "404 Not Found",
                   "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ", body.size(),
                   "\r\nConnection: close\r\n\r\n", body);
  for (size_t written = 0; written < reply.size();) {
    if (!WaitReady(fd, POLLOUT, deadline, stop_)) return;
    const ssize_t n =
        ::send(fd, reply.data() + written, reply.size() - written, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return;
    written += static_cast<size_t>(n);
  }
}

}  // namespace knnserve
