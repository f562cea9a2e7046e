// A minimal HTTP/1.0 server for Prometheus scrapes: GET /metrics answers the registry's text
// format; anything else is 404. One background thread serves one connection at a time (a scrape
// every few seconds needs no more), each for at most 2 seconds in all, slow clients included.
#ifndef KNNSERVE_SHARD_METRICS_HTTP_H_
#define KNNSERVE_SHARD_METRICS_HTTP_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "shard/metrics.h"

namespace knnserve {

// Thread-safe: Start returns a running server; the destructor stops it and joins the thread.
class MetricsHttpServer {
 public:
  // `address` is "host:port" (IPv4 host; port 0 picks a free one). `registry` must outlive the
  // server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& address,
                                                                  const MetricsRegistry* registry);
  // Start, or nullptr when `address` is empty (metrics off).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartUnlessEmpty(
      const std::string& address, const MetricsRegistry* registry);
  ~MetricsHttpServer();

  int port() const { return port_; }

 private:
  MetricsHttpServer(int listen_fd, int port, const MetricsRegistry* registry);
  void Serve();
  void HandleConnection(int fd);

  const int listen_fd_;
  const int port_;
  const MetricsRegistry* const registry_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace knnserve

#endif  // KNNSERVE_SHARD_METRICS_HTTP_H_
