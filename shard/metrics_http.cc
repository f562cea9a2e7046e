#include "shard/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace knnserve {
namespace {

constexpr int kPollMillis = 100;
constexpr size_t kMaxRequestBytes = 8192;

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

void WriteAll(int fd, const std::string& data) {
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = ::send(fd, data.data() + written, data.size() - written, MSG_NOSIGNAL);
    if (n <= 0) return;
    written += n;
  }
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
    if (fd < 0) continue;
    HandleConnection(fd);
    ::close(fd);
  }
}

void MetricsHttpServer::HandleConnection(int fd) {
  timeval timeout{1, 0};  // a stalled client cannot hold the thread for long
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string request;
  char buffer[1024];
  while (request.size() < kMaxRequestBytes && !absl::StrContains(request, "\r\n\r\n")) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    request.append(buffer, n);
  }
  const bool is_metrics =
      absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET / ");
  const std::string body = is_metrics ? registry_->RenderText() : "not found\n";
  WriteAll(fd, absl::StrCat("HTTP/1.0 ", is_metrics ? "200 OK" : "404 Not Found",
                            "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ",
                            body.size(), "\r\nConnection: close\r\n\r\n", body));
}

}  // namespace knnserve
