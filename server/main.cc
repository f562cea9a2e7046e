// knnserve-router: serves the v1 Retrieval service over a set of shard servers.
//
//   knnserve-router --shards FILE [--listen 127.0.0.1:6000] [--metrics-listen ADDR]
//                   [--tls-cert F --tls-key F [--tls-ca F]] [--hedge-delay-ms MS | --no-hedge]
//                   [--no-subset-sessions]
//
// FILE lists, per shard id, its replica addresses (server/shard_map.h). The TLS flags apply
// to both sides: the router serves with --tls-cert/--tls-key (requiring client certificates
// signed by --tls-ca when given) and calls shards over TLS verified against --tls-ca,
// presenting the same certificate (mTLS). Health is SERVING while every shard has a replica
// that answers. SIGTERM or SIGINT drains and exits 0.
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "common/cli_checks.h"
#include "common/process_init.h"
#include "server/router.h"
#include "shard/log.h"
#include "shard/metrics_http.h"
#include "shard/process.h"
#include "shard/retrieval_service.h"

namespace knnserve {
namespace {

struct RouterFlags {
  ServerFlags server;
  std::string shards_file;
  bool no_hedge = false;
  bool no_subset_sessions = false;
  double hedge_delay_ms = 0;
  double timeout_ms = 30000;
  double probe_interval_ms = 1000;
  std::string shard_tls_server_name;
};

int Run(const RouterFlags& flags) {
  absl::StatusOr<ShardMap> map = ReadShardMap(flags.shards_file);
  if (!map.ok()) {
    Log(LogLevel::kError, "cannot read the shard map", {{"error", map.status().ToString()}});
    return 1;
  }
  RouterOptions options;
  options.limits = flags.server.limits;
  options.hedge.enabled = !flags.no_hedge;
  options.subset_sessions = !flags.no_subset_sessions;
  options.hedge.delay = absl::Microseconds(static_cast<int64_t>(flags.hedge_delay_ms * 1000));
  options.max_timeout = absl::Microseconds(static_cast<int64_t>(flags.timeout_ms * 1000));
  options.probe_interval = absl::Microseconds(static_cast<int64_t>(flags.probe_interval_ms * 1000));
  options.shard_tls = flags.server.tls;
  options.shard_tls_server_name = flags.shard_tls_server_name;

  MetricsRegistry metrics;
  // Metrics first, then the gRPC port, then the probes: a router that cannot listen exits before
  // it probes (or logs "serving"), and no probe reaches a server that is gone.
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> metrics_server =
      MetricsHttpServer::StartUnlessEmpty(flags.server.metrics_listen, &metrics);
  if (!metrics_server.ok()) {
    Log(LogLevel::kError, "cannot serve metrics", {{"error", metrics_server.status().ToString()}});
    return 1;
  }
  // The probes report health to the server only while it serves. The mutex makes the drain
  // wait for a report in progress: the router (and its probe thread) outlives the server, so a
  // report could otherwise reach a freed server, or mark it SERVING after the drain marked it
  // NOT_SERVING.
  absl::Mutex serving_mu;
  RpcServer* serving_server = nullptr;  // guarded by serving_mu
  absl::StatusOr<std::unique_ptr<Router>> router =
      Router::Create(*map, options, &metrics, [&](bool healthy) {
        absl::MutexLock lock(&serving_mu);
        if (serving_server != nullptr) serving_server->SetServing(healthy);
      });
  if (!router.ok()) {
    Log(LogLevel::kError, "cannot start the router", {{"error", router.status().ToString()}});
    return 1;
  }
  RetrievalService service(router->get(), flags.server.limits, &metrics, flags.server.service);
  RpcServerOptions server_options{flags.server.listen, flags.server.tls,
                                  flags.server.limits.MaxMessageBytes(kRouterMaxDim)};
  absl::StatusOr<std::unique_ptr<RpcServer>> server = RpcServer::Start(server_options, &service);
  if (!server.ok()) {
    Log(LogLevel::kError, "cannot serve", {{"error", server.status().ToString()}});
    return 1;
  }
  {
    absl::MutexLock lock(&serving_mu);
    serving_server = server->get();
    serving_server->SetServing(false);
  }
  (*router)->StartProbing();
  Log(LogLevel::kInfo, "listening",
      {{"address", (*server)->address()},
       {"shards", map->size()},
       {"metrics_port", *metrics_server != nullptr ? (*metrics_server)->port() : 0}});
  const int signal = WaitForTerminationSignal();
  Log(LogLevel::kInfo, "draining", {{"signal", signal}});
  {
    absl::MutexLock lock(&serving_mu);
    serving_server = nullptr;
  }
  (*server)->Shutdown(absl::Seconds(flags.server.drain_seconds));
  Log(LogLevel::kInfo, "stopped");
  return 0;
}

}  // namespace
}  // namespace knnserve

int main(int argc, char** argv) {
  knnserve::InitProcess(argv);
  knnserve::KeepServedBlocksOnTheHeap();
  knnserve::BlockTerminationSignals();
  knnserve::RouterFlags flags;
  CLI::App app{"knnserve-router: fan kNN searches out to knnserve shards and merge them"};
  flags.server.Register(app, "127.0.0.1:6000");
  app.add_option("--shards", flags.shards_file,
                 "shard map: one line per shard, 'ID ADDRESS [ADDRESS...]'")
      ->required();
  CLI::Option* no_hedge =
      app.add_flag("--no-hedge", flags.no_hedge, "never send a second request to another replica");
  app.add_flag("--no-subset-sessions", flags.no_subset_sessions,
               "send a stream's subset groups to the shards with every step, not once per "
               "replica under a subset_session token (for shards that predate the token)");
  app.add_option("--hedge-delay-ms", flags.hedge_delay_ms,
                 "hedge after this delay (0: the shard's observed p95 latency)")
      ->check(knnserve::FiniteRange(0.0, 3600e3))
      ->excludes(no_hedge)
      ->capture_default_str();
  app.add_option("--timeout-ms", flags.timeout_ms,
                 "deadline for requests that set none (or a later one)")
      ->check(knnserve::FiniteRange(1.0, 86400e3))
      ->capture_default_str();
  app.add_option("--probe-interval-ms", flags.probe_interval_ms,
                 "how often every replica's Info is probed (health, shard ranges)")
      ->check(knnserve::FiniteRange(1.0, 3600e3))
      ->capture_default_str();
  app.add_option("--shard-tls-server-name", flags.shard_tls_server_name,
                 "name the shards' certificates carry, when not their address's host");
  CLI11_PARSE(app, argc, argv);
  if (!flags.shard_tls_server_name.empty() && !flags.server.tls.enabled()) {
    return app.exit(
        CLI::ValidationError("--shard-tls-server-name",
                             "names the shards' TLS certificates, and the router calls its "
                             "shards over TLS only with --tls-cert/--tls-key/--tls-ca"));
  }
  flags.server.InitLogging("router");
  return knnserve::Run(flags);
}
