// knnserve-shard: serves one shard of an index directory over the v1 Retrieval service.
//
//   knnserve-shard --index DIR --shard ID [--listen 127.0.0.1:7000] [--metrics-listen ADDR]
//                  [--tls-cert F --tls-key F [--tls-ca F]] [--threads N] [--batch-wait-us U]
//                  [--subset-device cpu|cuda] [--subset-only]
//
// It listens at once with health NOT_SERVING, loads and verifies the shard (sizes and SHA-256
// from the manifest), runs a warm-up query, then reports SERVING. SIGTERM or SIGINT drains:
// health NOT_SERVING, no new calls, calls in flight finish (up to --drain-seconds), exit 0;
// while the shard is still loading, it exits 0 at once.
#include <cstdlib>
#include <memory>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "common/index/index_engine.h"
#include "common/index/manifest.h"
#include "common/index/subset_device.h"
#include "common/process_init.h"
#include "shard/log.h"
#include "shard/metrics_http.h"
#include "shard/process.h"
#include "shard/retrieval_service.h"
#include "shard/shard_backend.h"

namespace knnserve {
namespace {

struct ShardFlags {
  ServerFlags server;
  std::string index_dir;
  int shard_id = -1;
  int threads = 1;
  BatcherOptions batcher;
  int64_t batch_wait_us = 1000;
  int64_t inline_budget_us = 2000;
  int64_t max_queued_mib = 1024;
  std::string subset_device = "cpu";
  bool subset_only = false;
};

int Run(const ShardFlags& flags) {
  absl::StatusOr<IndexManifest> manifest = ReadManifest(flags.index_dir);
  if (!manifest.ok()) {
    Log(LogLevel::kError, "cannot read the index", {{"error", manifest.status().ToString()}});
    return 1;
  }
  if (flags.shard_id < 0 || flags.shard_id >= static_cast<int>(manifest->shards.size())) {
    Log(LogLevel::kError, "no such shard",
        {{"shard", flags.shard_id}, {"shards", manifest->shards.size()}});
    return 1;
  }
  IndexEngineOptions engine_options;
  engine_options.threads = flags.threads;
  engine_options.full_search = !flags.subset_only;
  if (absl::Status s = UseSubsetDevice(flags.subset_device, engine_options); !s.ok()) {
    Log(LogLevel::kError, "bad --subset-device", {{"error", s.ToString()}});
    return 1;
  }
  MetricsRegistry metrics;
  BatcherOptions batcher = flags.batcher;
  batcher.max_wait = absl::Microseconds(flags.batch_wait_us);
  batcher.inline_budget = absl::Microseconds(flags.inline_budget_us);
  batcher.engine_threads = flags.threads;
  batcher.max_queued_bytes = flags.max_queued_mib << 20;
  ShardBackend backend(flags.shard_id, batcher, &metrics);
  RetrievalService service(&backend, flags.server.limits, &metrics, flags.server.service);
  RpcServerOptions options{flags.server.listen, flags.server.tls,
                           flags.server.limits.MaxMessageBytes(manifest->dim)};
  absl::StatusOr<std::unique_ptr<RpcServer>> server = RpcServer::Start(options, &service);
  if (!server.ok()) {
    Log(LogLevel::kError, "cannot serve", {{"error", server.status().ToString()}});
    return 1;
  }
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> metrics_server =
      MetricsHttpServer::StartUnlessEmpty(flags.server.metrics_listen, &metrics);
  if (!metrics_server.ok()) {
    Log(LogLevel::kError, "cannot serve metrics", {{"error", metrics_server.status().ToString()}});
    return 1;
  }
  Log(LogLevel::kInfo, "listening",
      {{"address", (*server)->address()},
       {"shard", flags.shard_id},
       {"metrics_port", *metrics_server != nullptr ? (*metrics_server)->port() : 0}});

  // The load and a termination signal race: whichever comes second sees what the first did.
  absl::Mutex mu;
  bool loading = true;       // guarded by mu
  bool terminating = false;  // guarded by mu
  bool load_failed = false;  // written before loading is cleared
  std::thread loader([&] {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<SearchEngine>> engine =
        CreateEngine(flags.index_dir, flags.shard_id, engine_options);
    absl::Status status = engine.ok() ? backend.SetEngine(*std::move(engine)) : engine.status();
    absl::MutexLock lock(&mu);
    loading = false;
    if (!status.ok()) {
      Log(LogLevel::kError, "cannot load the shard", {{"error", status.ToString()}});
      load_failed = true;
      RequestTermination();
      return;
    }
    if (terminating) return;  // a draining shard never reports SERVING
    (*server)->SetServing(true);
    Log(LogLevel::kInfo, "serving",
        {{"address", (*server)->address()},
         {"shard", flags.shard_id},
         {"load_seconds", absl::ToDoubleSeconds(absl::Now() - start)}});
  });
  const int signal = WaitForTerminationSignal();
  {
    absl::MutexLock lock(&mu);
    terminating = true;
    if (loading) {
      // A loading shard has no search to drain, and its load (every file's SHA-256, the
      // warm-up) can take minutes that a pod being replaced should not wait out; the loader
      // cannot be interrupted, so the process ends here.
      Log(LogLevel::kInfo, "stopped while loading", {{"signal", signal}});
      std::_Exit(0);
    }
  }
  loader.join();
  Log(LogLevel::kInfo, "draining", {{"signal", signal}});
  (*server)->Shutdown(absl::Seconds(flags.server.drain_seconds));
  Log(LogLevel::kInfo, "stopped");
  return load_failed ? 1 : 0;
}

}  // namespace
}  // namespace knnserve

int main(int argc, char** argv) {
  knnserve::InitProcess(argv);
  knnserve::KeepServedBlocksOnTheHeap();
  knnserve::BlockTerminationSignals();
  knnserve::ShardFlags flags;
  CLI::App app{"knnserve-shard: serve one shard of a knnserve index over gRPC"};
  flags.server.Register(app, "127.0.0.1:7000");
  app.add_option("--index", flags.index_dir, "index directory (with manifest.json)")->required();
  app.add_option("--shard", flags.shard_id, "shard id to serve")->required();
  app.add_option("--threads", flags.threads, "OpenMP threads per search")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--batch-threads", flags.batcher.num_threads, "engine calls that may run at once")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--batch-wait-us", flags.batch_wait_us,
                 "longest a request waits to be batched with others (0: only what queued)")
      ->check(CLI::Range(0, 10'000'000))
      ->capture_default_str();
  app.add_option("--inline-budget-us", flags.inline_budget_us,
                 "a request expected to search within this long runs on the gRPC thread that "
                 "received it when the shard is idle (0: always hand it to a worker)")
      ->check(CLI::Range(0, 10'000'000))
      ->capture_default_str();
  app.add_option(
         "--max-queued-mib", flags.max_queued_mib,
         "MiB that waiting requests may hold (queries, declared subset ids, answers); beyond, "
         "requests are answered "
         "UNAVAILABLE (overloaded) at once")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--max-batch-rows", flags.batcher.max_batch_rows,
                 "most query rows coalesced into one engine call")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--subset-device", flags.subset_device,
                 "where subset ADC runs: cpu, or cuda (codes on the current GPU; CUDA builds)")
      ->capture_default_str();
  app.add_flag("--subset-only", flags.subset_only,
               "load only the subset codes and values (no faiss index): subset searches only, "
               "full searches fail with FAILED_PRECONDITION");
  CLI11_PARSE(app, argc, argv);
  flags.server.InitLogging("shard");
  return knnserve::Run(flags);
}
