#include "shard/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shard/metrics_http.h"

namespace knnserve {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, RendersPrometheusText) {
  MetricsRegistry registry;
  registry.GetCounter("knnserve_x_total", "X things", {{"shard", "1"}})->Increment(3);
  registry.GetGauge("knnserve_y", "Y")->Set(-2);
  Histogram* h = registry.GetHistogram("knnserve_z_seconds", "Z", {{"m", "a\"b"}}, {0.1, 1.0});
  h->Observe(0.05);
  h->Observe(0.5);
  h->Observe(5);
  EXPECT_EQ(registry.GetCounter("knnserve_x_total", "X things", {{"shard", "1"}})->value(), 3);
  const std::string text = registry.RenderText();
  EXPECT_THAT(text,
              HasSubstr("# TYPE knnserve_x_total counter\nknnserve_x_total{shard=\"1\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("knnserve_y -2\n"));
  EXPECT_THAT(text, HasSubstr("knnserve_z_seconds_bucket{m=\"a\\\"b\",le=\"0.1\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("knnserve_z_seconds_bucket{m=\"a\\\"b\",le=\"1\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("knnserve_z_seconds_bucket{m=\"a\\\"b\",le=\"+Inf\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("knnserve_z_seconds_count{m=\"a\\\"b\"} 3\n"));
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n");
  (void)::send(fd, request.data(), request.size(), 0);
  std::string reply;
  char buffer[4096];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) reply.append(buffer, n);
  ::close(fd);
  return reply;
}

TEST(MetricsHttpServerTest, ServesMetricsOverHttp) {
  MetricsRegistry registry;
  registry.GetCounter("knnserve_scraped_total", "Scrapes")->Increment();
  ASSERT_OK_AND_ASSIGN(auto server, MetricsHttpServer::Start("127.0.0.1:0", &registry));
  const std::string reply = HttpGet(server->port(), "/metrics");
  EXPECT_THAT(reply, HasSubstr("HTTP/1.0 200 OK"));
  EXPECT_THAT(reply, HasSubstr("knnserve_scraped_total 1"));
  EXPECT_THAT(HttpGet(server->port(), "/other"), HasSubstr("404"));
}

// A client that trickles its request a byte at a time holds the one serving thread for the
// connection's 2 seconds at most: a scrape behind it is answered, and the server stops while the
// slow client is still connected.
TEST(MetricsHttpServerTest, ASlowClientHoldsTheServerForItsDeadlineOnly) {
  MetricsRegistry registry;
  registry.GetCounter("knnserve_scraped_total", "Scrapes")->Increment();
  ASSERT_OK_AND_ASSIGN(auto server, MetricsHttpServer::Start("127.0.0.1:0", &registry));
  const int slow = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(slow, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {  // one byte every 100 ms: 80 s for the server's 8 KiB
    while (trickling.load() && ::send(slow, "G", 1, MSG_NOSIGNAL) == 1) {
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  absl::SleepFor(absl::Milliseconds(300));  // the slow client is being served
  EXPECT_THAT(HttpGet(server->port(), "/metrics"), HasSubstr("knnserve_scraped_total 1"));
  // The server hung up on the slow client (before, it read on for 8 KiB: 80 s).
  const timeval ten_seconds{10, 0};
  ::setsockopt(slow, SOL_SOCKET, SO_RCVTIMEO, &ten_seconds, sizeof(ten_seconds));
  char byte;
  const ssize_t n = ::recv(slow, &byte, 1, 0);
  EXPECT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET)) << n << " " << std::strerror(errno);
  server.reset();  // returns while the slow client trickles on (it waited for it to give up)
  trickling.store(false);
  trickle.join();
  ::close(slow);
}

TEST(MetricsHttpServerTest, RejectsBadAddress) {
  MetricsRegistry registry;
  EXPECT_FALSE(MetricsHttpServer::Start("nonsense", &registry).ok());
}

}  // namespace
}  // namespace knnserve
