// Service benchmarks (issue 4): the router and shard servers over loopback gRPC against
// in-process search of the same index. Prints a Markdown table; never asserts on speed.
//
//   service_bench [--vectors N] [--dim D] [--factory STR] [--nprobe P] [--batch B] [--k K]
//                 [--seconds S] [--slices N] [--pairs N] [--work-dir DIR] [--parts abcds]
//
// a) router + 1 shard vs in-process search of the same index (throughput, p50 overhead, the
//    overhead also measured in pairs and split into the engine call and the service);
// b) 4 shards behind the router vs one in-process index of the same total size;
// c) per-step latency at a steady request rate over 4 shards x 2 replicas, then with one
//    replica of shard 0 delayed by 50 ms, with hedging on and off;
// d) per-step cost of a subset kNN-MT stream through the router and 2 shards whose engines
//    answer at once: the subset sent with every step vs once per shard (subset_session),
//    fp32 vs fp16 queries;
// s) the service alone: a)'s request through the router and a shard whose engine answers at
//    once, back to back and after 40 ms idle (a) prints it too, idle for its in-process p50;
//    s needs no index).
// Servers run in this process (their own gRPC threads, loopback TCP); indexes are built once
// into --work-dir from seeded random keys and reused by later runs.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/random_keys.h"
#include "common/datastore/key_source.h"
#include "common/index/builder.h"
#include "common/index/index_engine.h"
#include "common/process_init.h"
#include "common/wire.h"
#include "shard/log.h"
#include "tests/server/test_cluster.h"

namespace knnserve {
namespace {

using testing::ControlledEngine;
using testing::TestRouter;
using testing::TestShard;

struct Flags {
  int64_t vectors = 200000;
  int dim = 512;
  std::string factory = "IVF1024,PQ64";
  int nprobe = 32;
  int batch = 64;
  int k = 64;
  double seconds = 5;
  int slices = 5;   // a) and b): each side measured in this many alternating slices
  int pairs = 100;  // a): in-process / router pairs of the paired p50 overhead
  double steady_seconds = 30;
  int64_t train_size = 65536;
  std::string work_dir = "/tmp/knnserve-bench";
  int subset_steps = 200;
  int subset_sentences = 64;  // source sentences per decoding batch: one subset group each
  int beam = 5;
  int group_size = 512;
  int subset_rounds = 3;
  int shard_batch_threads =
      BatcherOptions().num_threads;  // a), b), s): each shard's engine calls at once
  int64_t shard_inline_budget_us =
      absl::ToInt64Microseconds(BatcherOptions().inline_budget);  // a), b), s)
};

std::string IndexDir(const Flags& flags, int shards) {
  const std::string dir = absl::StrCat(flags.work_dir, "/", flags.vectors, "x", flags.dim, "_",
                                       flags.factory, "_s", shards);
  if (std::filesystem::exists(dir + "/manifest.json")) return dir;
  std::fprintf(stderr, "building %s ...\n", dir.c_str());
  IndexBuildOptions options;
  options.factory = flags.factory;
  options.shards = shards;
  options.threads = 2;
  options.train_size = flags.train_size;
  RandomKeySource keys(flags.vectors, flags.dim);
  absl::StatusOr<IndexManifest> manifest = BuildIndex(keys, nullptr, options, dir);
  KNNSERVE_CHECK(manifest.ok(), std::string(manifest.status().message()).c_str());
  return dir;
}

std::unique_ptr<SearchEngine> Engine(const std::string& dir, int shard) {
  absl::StatusOr<std::unique_ptr<SearchEngine>> engine = CreateEngine(dir, shard, {.threads = 1});
  KNNSERVE_CHECK(engine.ok(), std::string(engine.status().message()).c_str());
  return *std::move(engine);
}

struct Stats {
  double rows = 0;
  double seconds = 0;
  std::vector<absl::Duration> latencies;  // sorted

  double rows_per_second() const { return seconds > 0 ? rows / seconds : 0.0; }
  // Adds another measurement of the same thing.
  void Add(const Stats& other) {
    rows += other.rows;
    seconds += other.seconds;
    const size_t middle = latencies.size();
    latencies.insert(latencies.end(), other.latencies.begin(), other.latencies.end());
    std::inplace_merge(latencies.begin(), latencies.begin() + middle, latencies.end());
  }
  absl::Duration Quantile(double q) const {
    if (latencies.empty()) return absl::ZeroDuration();
    return latencies[std::min(latencies.size() - 1, static_cast<size_t>(q * latencies.size()))];
  }
};

// Closed loop: `clients` threads each call `search` back to back for `seconds`.
Stats ClosedLoop(int clients, double seconds, int batch,
                 const std::function<void(int client)>& search) {
  absl::Mutex mu;
  std::vector<absl::Duration> latencies;
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(seconds);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::vector<absl::Duration> mine;
      while (absl::Now() < end) {
        const absl::Time t = absl::Now();
        search(c);
        mine.push_back(absl::Now() - t);
      }
      absl::MutexLock lock(&mu);
      latencies.insert(latencies.end(), mine.begin(), mine.end());
    });
  }
  for (std::thread& t : threads) t.join();
  Stats stats;
  stats.rows = latencies.size() * static_cast<double>(batch);
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::sort(latencies.begin(), latencies.end());
  stats.latencies = std::move(latencies);
  return stats;
}

SearchQuery Query(const Flags& flags, uint32_t seed) {
  SearchQuery query;
  query.queries = testing::RandomQueries(flags.batch, flags.dim, seed);
  query.params.k = flags.k;
  query.params.nprobe = flags.nprobe;
  return query;
}

v1::SearchRequest Request(const Flags& flags, uint32_t seed) {
  const SearchQuery query = Query(flags, seed);
  v1::SearchRequest request;
  EncodeSearchRequest(query.queries.view(), v1::DTYPE_FP32, query.params, &request);
  return request;
}

Stats InProcess(const Flags& flags, const SearchEngine& engine, int clients, double seconds) {
  std::vector<SearchQuery> queries;
  for (int c = 0; c < clients; ++c) queries.push_back(Query(flags, c));
  return ClosedLoop(clients, seconds, flags.batch, [&](int c) {
    KNNSERVE_CHECK(engine.Search(queries[c]).ok(), "in-process search");
  });
}

// Closed-loop clients of a router, each with its own channel and request.
struct RouterClients {
  RouterClients(const Flags& flags, const std::string& address, int clients) {
    for (int c = 0; c < clients; ++c) {
      requests.push_back(Request(flags, c));
      stubs.push_back(testing::Connect(address));
    }
  }
  std::vector<v1::SearchRequest> requests;
  std::vector<std::unique_ptr<v1::Retrieval::Stub>> stubs;
};

// One search by client `c`; returns how long it took.
absl::Duration RoutedOnce(const RouterClients& clients, int c = 0) {
  const absl::Time start = absl::Now();
  v1::SearchResponse response;
  const grpc::Status status = testing::CallSearch(clients.stubs[c].get(), clients.requests[c],
                                                  &response, absl::Seconds(120));
  KNNSERVE_CHECK(status.ok(), status.error_message().c_str());
  return absl::Now() - start;
}

Stats ThroughRouter(const Flags& flags, const RouterClients& clients, double seconds) {
  return ClosedLoop(static_cast<int>(clients.stubs.size()), seconds, flags.batch,
                    [&](int c) { RoutedOnce(clients, c); });
}

// Each side measured `flags.seconds` in `flags.slices` slices, the sides alternating: this
// machine's speed drifts by tens of percent within seconds, so one block per side measured the
// drift as much as the service.
using Side = std::function<Stats(double seconds)>;
std::vector<Stats> Alternate(const Flags& flags, const std::vector<Side>& sides) {
  const double slice = flags.seconds / std::max(1, flags.slices);
  std::vector<Stats> stats(sides.size());
  for (int i = 0; i < std::max(1, flags.slices); ++i) {
    for (size_t s = 0; s < sides.size(); ++s) stats[s].Add(sides[s](slice));
  }
  return stats;
}

Side InProcessSide(const Flags& flags, const SearchEngine& engine, int clients) {
  return [&flags, &engine, clients](double seconds) {
    return InProcess(flags, engine, clients, seconds);
  };
}

Side RouterSide(const Flags& flags, const RouterClients& clients) {
  return [&flags, &clients](double seconds) { return ThroughRouter(flags, clients, seconds); };
}

std::string Ms(absl::Duration d) { return absl::StrFormat("%.2f", absl::ToDoubleMilliseconds(d)); }

// Times every Search of the engine it wraps: a shard's engine time splits a)'s p50 overhead into
// the search running slower inside the server and the service's own work around it.
// Thread-safe.
class TimedEngine : public SearchEngine {
 public:
  explicit TimedEngine(std::unique_ptr<SearchEngine> engine) : engine_(std::move(engine)) {}
  const EngineInfo& info() const override { return engine_->info(); }
  // The engine itself, untimed.
  const SearchEngine& inner() const { return *engine_; }
  absl::StatusOr<EngineResult> Search(const SearchQuery& query) const override {
    const absl::Time start = absl::Now();
    absl::StatusOr<EngineResult> result = engine_->Search(query);
    const absl::Duration took = absl::Now() - start;
    absl::MutexLock lock(&mu_);
    times_.push_back(took);
    return result;
  }
  // The times recorded since the last call, as Stats (latencies only).
  Stats TakeTimes() {
    Stats stats;
    {
      absl::MutexLock lock(&mu_);
      stats.latencies.swap(times_);
    }
    std::sort(stats.latencies.begin(), stats.latencies.end());
    return stats;
  }

 private:
  const std::unique_ptr<SearchEngine> engine_;
  mutable absl::Mutex mu_;
  mutable std::vector<absl::Duration> times_ ABSL_GUARDED_BY(mu_);
};

// The shards of `dir`, `replicas` each, and a router over them.
struct Cluster {
  Cluster(const std::string& dir, int shards, int replicas, RouterOptions options,
          BatcherOptions batcher = BatcherOptions()) {
    testing::TestShardOptions shard_options;
    shard_options.batcher = batcher;
    ShardMap map;
    for (int r = 0; r < replicas; ++r) {
      for (int s = 0; s < shards; ++s) {
        auto engine = std::make_unique<TimedEngine>(Engine(dir, s));
        engines.push_back(engine.get());
        servers.push_back(std::make_unique<TestShard>(s, std::move(engine), shard_options));
        map[s].push_back(servers.back()->address());
      }
    }
    router = std::make_unique<TestRouter>(map, std::move(options));
  }
  std::vector<std::unique_ptr<TestShard>> servers;  // replica-major
  std::vector<TimedEngine*> engines;                // servers[i]'s engine
  std::unique_ptr<TestRouter> router;
};

// a)'s, b)'s and s)'s shards batch as knnserve-shard --batch-threads and --inline-budget-us say.
BatcherOptions ShardBatcher(const Flags& flags) {
  BatcherOptions options;
  options.num_threads = flags.shard_batch_threads;
  options.inline_budget = absl::Microseconds(flags.shard_inline_budget_us);
  return options;
}

RouterOptions Options(bool hedge) {
  RouterOptions options = testing::FastRouterOptions();
  options.probe_interval = absl::Seconds(1);
  options.probe_timeout = absl::Seconds(10);  // shared 2-core machines can stall for seconds
  options.hedge.enabled = hedge;
  return options;
}

// Answers every query at once: what remains is the service's own work. The answer has a real
// search's size on the wire: distinct ids of the slice, distances ascending (missing
// neighbours' ids, -1, would take 10 bytes each as varints instead of 3 and parse slower).
class InstantEngine : public SearchEngine {
 public:
  InstantEngine(int dim, int64_t num_sentences, int shard, int num_shards) {
    info_.dim = dim;
    info_.factory = "Flat";
    info_.total_vectors = num_sentences;
    info_.num_sentences = num_sentences;
    info_.sentence_begin = info_.id_begin = num_sentences * shard / num_shards;
    info_.sentence_end = info_.id_end = num_sentences * (shard + 1) / num_shards;
  }
  const EngineInfo& info() const override { return info_; }
  absl::StatusOr<EngineResult> Search(const SearchQuery& query) const override {
    Neighbors neighbors =
        Neighbors::Missing(query.queries.rows(), query.params.k, info_.metric, false);
    const int64_t span = std::max<int64_t>(1, info_.id_end - info_.id_begin);
    for (size_t i = 0; i < neighbors.ids.size(); ++i) {
      neighbors.ids[i] = info_.id_begin + static_cast<int64_t>(i * 7919) % span;
      neighbors.distances[i] = static_cast<float>(i % query.params.k);
    }
    return EngineResult{std::move(neighbors), 0};
  }

 private:
  EngineInfo info_;
};

absl::Duration Median(std::vector<absl::Duration> durations) {
  std::sort(durations.begin(), durations.end());
  return durations.empty() ? absl::ZeroDuration() : durations[durations.size() / 2];
}

// The median latency of a)'s request through the router and one shard whose engine answers at
// once: the service's own share of a)'s p50 overhead, without the search's noise. Measured back
// to back and with the client asleep for `pause` before each request. In a)'s pairs the client
// searches in-process for that long while the service's threads sleep; on this VM a request
// after ~40 ms in which the service did nothing took ~0.5 ms longer than one right after
// another (the client sleeping or spinning meanwhile alike, docs/service.md run 16).
struct ServiceAlone {
  absl::Duration back_to_back;
  absl::Duration after_pause;
};

ServiceAlone ServiceAloneLatency(const Flags& flags, absl::Duration pause) {
  testing::TestShardOptions shard_options;
  shard_options.batcher = ShardBatcher(flags);
  TestShard shard(0, std::make_unique<InstantEngine>(flags.dim, flags.vectors, 0, 1),
                  shard_options);
  ShardMap map;
  map[0].push_back(shard.address());
  TestRouter router(map, Options(false));
  const RouterClients clients(flags, router.address(), 1);
  ThroughRouter(flags, clients, 0.5);  // warm-up: channels, allocations
  ServiceAlone result;
  result.back_to_back =
      ThroughRouter(flags, clients, std::max(1.0, flags.seconds / 2)).Quantile(0.5);
  std::vector<absl::Duration> paused;
  for (int i = 0; i < flags.pairs; ++i) {
    absl::SleepFor(pause);
    paused.push_back(RoutedOnce(clients));
  }
  result.after_pause = Median(std::move(paused));
  return result;
}

std::string ServiceAloneLine(const Flags& flags, absl::Duration pause) {
  const ServiceAlone alone = ServiceAloneLatency(flags, pause);
  return absl::StrFormat(
      "The same request through the router and a shard whose engine answers at once: p50 %s ms "
      "back to back, %s ms after %s ms idle (median of %d).\n",
      Ms(alone.back_to_back), Ms(alone.after_pause), Ms(pause), flags.pairs);
}

// a)'s p50 overhead measured in pairs: one client alternates a search in-process and the same
// request through the router, `flags.pairs` routed requests between `flags.pairs` + 1 searches,
// so that every request follows a search (the service idle meanwhile, as in a)) and every search
// follows a request. Each request is paired with the search before it and, apart, with the
// search after it: were one order to favour a side (caches the other side filled, the same
// query's lists searched just before), the two pairings would differ. This machine's speed
// drifts by more than the overhead within the seconds a slice lasts, which moved the slices'
// p50 difference by milliseconds from run to run; each pair's difference cancels the drift.
// Each median is taken over the pairs on its own: the overhead is not the sum of the others.
struct PairedOverhead {
  absl::Duration overhead_before, overhead_after;  // through the router - in-process
  absl::Duration engine_before, engine_after;      // the shard's engine call - in-process
  absl::Duration service;                          // through the router - the shard's engine call
};

PairedOverhead Paired(const Flags& flags, const SearchEngine& engine, TimedEngine& shard_engine,
                      const std::string& router_address) {
  const SearchQuery query = Query(flags, 0);
  const RouterClients client(flags, router_address, 1);  // the same queries (seed 0)
  const auto search_in_process = [&] {
    const absl::Time start = absl::Now();
    KNNSERVE_CHECK(engine.Search(query).ok(), "in-process search");
    return absl::Now() - start;
  };
  RoutedOnce(client);  // warm-up: the channel's connection
  std::vector<absl::Duration> local = {search_in_process()};
  std::vector<absl::Duration> routed, shard;
  shard_engine.TakeTimes();
  for (int i = 0; i < flags.pairs; ++i) {
    routed.push_back(RoutedOnce(client));
    const Stats engine_calls = shard_engine.TakeTimes();
    KNNSERVE_CHECK(engine_calls.latencies.size() == 1, "one engine call per request");
    shard.push_back(engine_calls.latencies[0]);
    local.push_back(search_in_process());
  }
  const auto median_minus_search = [&](const std::vector<absl::Duration>& times, int offset) {
    std::vector<absl::Duration> differences;
    for (int i = 0; i < flags.pairs; ++i) differences.push_back(times[i] - local[i + offset]);
    return Median(std::move(differences));
  };
  std::vector<absl::Duration> service;
  for (int i = 0; i < flags.pairs; ++i) service.push_back(routed[i] - shard[i]);
  return {median_minus_search(routed, 0), median_minus_search(routed, 1),
          median_minus_search(shard, 0), median_minus_search(shard, 1), Median(std::move(service))};
}

void BenchA(const Flags& flags) {
  const std::string dir = IndexDir(flags, 1);
  Cluster cluster(dir, 1, 1, Options(false), ShardBatcher(flags));
  // The in-process side searches the shard's own engine: two loaded copies of one index
  // differed in speed by more than the service costs.
  const SearchEngine& engine = cluster.engines[0]->inner();
  std::printf(
      "\n### a) router + 1 shard over loopback vs in-process (%s, %lld x %d, batch %d, "
      "k %d, nprobe %d)\n\n",
      flags.factory.c_str(), static_cast<long long>(flags.vectors), flags.dim, flags.batch, flags.k,
      flags.nprobe);
  std::printf(
      "| clients | in-process rows/s | router rows/s | ratio | in-process p50 ms | "
      "router p50 ms | p50 overhead ms | shard engine p50 ms |\n"
      "|---|---|---|---|---|---|---|---|\n");
  absl::Duration in_process_p50;  // one client's: the idle gap before each request in the pairs
  for (int clients : {1, 2}) {
    const RouterClients router_clients(flags, cluster.router->address(), clients);
    cluster.engines[0]->TakeTimes();  // the warm-up's and earlier rows'
    const std::vector<Stats> stats = Alternate(
        flags, {InProcessSide(flags, engine, clients), RouterSide(flags, router_clients)});
    const Stats& local = stats[0];
    const Stats& remote = stats[1];
    if (clients == 1) in_process_p50 = local.Quantile(0.5);
    std::printf("| %d | %.0f | %.0f | %.3f | %s | %s | %s | %s |\n", clients,
                local.rows_per_second(), remote.rows_per_second(),
                remote.rows_per_second() / local.rows_per_second(), Ms(local.Quantile(0.5)).c_str(),
                Ms(remote.Quantile(0.5)).c_str(),
                Ms(remote.Quantile(0.5) - local.Quantile(0.5)).c_str(),
                Ms(cluster.engines[0]->TakeTimes().Quantile(0.5)).c_str());
    std::fflush(stdout);
  }
  const PairedOverhead paired =
      Paired(flags, engine, *cluster.engines[0], cluster.router->address());
  std::printf(
      "\nPaired, one client: %d requests through the router alternating with the same search "
      "in-process (medians of the pairs' differences, each on its own). Each request minus the "
      "search before it: p50 overhead %s ms, the shard's engine call minus that search %s ms; "
      "minus the search after it: %s ms and %s ms. The service around the engine call: %s ms.\n",
      flags.pairs, Ms(paired.overhead_before).c_str(), Ms(paired.engine_before).c_str(),
      Ms(paired.overhead_after).c_str(), Ms(paired.engine_after).c_str(),
      Ms(paired.service).c_str());
  std::printf("%s", ServiceAloneLine(flags, in_process_p50).c_str());
  std::fflush(stdout);
}

// The third side searches the 4 shards' engines one after another in the client's thread and
// merges their answers (CreateLocalEngine without merged lists): the shards' own work, without
// the service, so that b)'s gap splits into engine cost and service cost.
void BenchB(const Flags& flags) {
  std::unique_ptr<SearchEngine> engine = Engine(IndexDir(flags, 1), 0);
  const std::string dir = IndexDir(flags, 4);
  absl::StatusOr<std::unique_ptr<SearchEngine>> shard_engines =
      CreateLocalEngine(dir, {.threads = 1, .merge_shards = false});
  KNNSERVE_CHECK(shard_engines.ok(), std::string(shard_engines.status().message()).c_str());
  Cluster cluster(dir, 4, 1, Options(false), ShardBatcher(flags));
  std::printf(
      "\n### b) 4 shards behind the router vs one in-process index of the same size\n\n"
      "| clients | in-process rows/s | 4 shard engines in-process rows/s | 4 shards rows/s | "
      "ratio | engines ratio |\n|---|---|---|---|---|---|\n");
  for (int clients : {1, 2}) {
    const RouterClients router_clients(flags, cluster.router->address(), clients);
    const std::vector<Stats> stats = Alternate(
        flags, {InProcessSide(flags, *engine, clients),
                InProcessSide(flags, **shard_engines, clients), RouterSide(flags, router_clients)});
    const double local = stats[0].rows_per_second();
    std::printf("| %d | %.0f | %.0f | %.0f | %.3f | %.3f |\n", clients, local,
                stats[1].rows_per_second(), stats[2].rows_per_second(),
                stats[2].rows_per_second() / local, stats[1].rows_per_second() / local);
    std::fflush(stdout);
  }
}

// Open loop: one request every 1/rate seconds for `seconds`, each answered asynchronously.
Stats SteadyRate(const Flags& flags, const std::string& address, double rate) {
  auto stub = testing::Connect(address);
  const v1::SearchRequest request = Request(flags, 7);
  absl::Mutex mu;
  std::vector<absl::Duration> latencies;
  int outstanding = 0;
  const absl::Duration interval = absl::Seconds(1 / rate);
  const int total = static_cast<int>(rate * flags.steady_seconds);
  const absl::Time start = absl::Now();
  for (int i = 0; i < total; ++i) {
    absl::SleepFor(start + i * interval - absl::Now());
    auto context = std::make_shared<grpc::ClientContext>();
    auto response = std::make_shared<v1::SearchResponse>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    const absl::Time sent = absl::Now();
    {
      absl::MutexLock lock(&mu);
      ++outstanding;
    }
    stub->async()->Search(context.get(), &request, response.get(),
                          [&, context, response, sent](grpc::Status status) {
                            KNNSERVE_CHECK(status.ok(), status.error_message().c_str());
                            absl::MutexLock lock(&mu);
                            latencies.push_back(absl::Now() - sent);
                            --outstanding;
                          });
  }
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &outstanding));
  Stats stats;
  std::sort(latencies.begin(), latencies.end());
  stats.latencies = std::move(latencies);
  return stats;
}

int64_t SumCounter(MetricsRegistry& metrics, const std::string& name) {
  int64_t sum = 0;
  std::istringstream text(metrics.RenderText());
  for (std::string line; std::getline(text, line);) {
    if (line.rfind(name + "{", 0) == 0) sum += std::stoll(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

void BenchC(const Flags& flags) {
  const std::string dir = IndexDir(flags, 4);
  // The steady rate: a third of what one closed-loop client gets through the router.
  Cluster probe(dir, 4, 1, Options(false));
  const double capacity =
      ThroughRouter(flags, RouterClients(flags, probe.router->address(), 1), flags.seconds)
          .rows_per_second() /
      flags.batch;
  const double rate = std::max(1.0, capacity / 3);
  std::printf(
      "\n### c) per-step latency at %.1f requests/s (4 shards x 2 replicas, batch %d, "
      "k %d)\n\n| scenario | p50 ms | p99 ms | p99.9 ms | p99/p50 | extra shard requests "
      "|\n|---|---|---|---|---|---|\n",
      rate, flags.batch, flags.k);
  struct Scenario {
    const char* name;
    bool delayed;
    bool hedge;
  };
  for (const Scenario& scenario :
       {Scenario{"no delay, hedging on", false, true},
        Scenario{"shard 0 replica 0 +50 ms, hedging on", true, true},
        Scenario{"shard 0 replica 0 +50 ms, hedging off", true, false}}) {
    Cluster cluster(dir, 4, 2, Options(scenario.hedge));
    if (scenario.delayed) cluster.servers[0]->engine()->set_delay(absl::Milliseconds(50));
    const Stats stats = SteadyRate(flags, cluster.router->address(), rate);
    MetricsRegistry& metrics = cluster.router->metrics();
    const int64_t shard_calls = SumCounter(metrics, "knnserve_shard_requests_total");
    const int64_t extra = SumCounter(metrics, "knnserve_hedges_sent_total") +
                          SumCounter(metrics, "knnserve_failovers_total");
    std::printf("| %s | %s | %s | %s | %.2f | %.2f%% |\n", scenario.name,
                Ms(stats.Quantile(0.5)).c_str(), Ms(stats.Quantile(0.99)).c_str(),
                Ms(stats.Quantile(0.999)).c_str(),
                absl::FDivDuration(stats.Quantile(0.99), stats.Quantile(0.5)),
                100.0 * extra / std::max<int64_t>(1, shard_calls));
    std::fflush(stdout);
  }
}

// One decoding batch's stream: the setup, then `subset_steps` steps; returns the median step
// time (the setup and the first step, where the shards learn the subset, included in none).
absl::Duration SubsetStream(const Flags& flags, const std::string& address, v1::DType dtype) {
  const int64_t num_sentences = int64_t{flags.subset_sentences} * flags.group_size * 2;
  std::mt19937 rng(11);
  v1::StreamRequest setup;
  for (int g = 0; g < flags.subset_sentences; ++g) {
    std::vector<int64_t> ids(num_sentences);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(flags.group_size);
    setup.mutable_setup()->add_subset_groups()->mutable_sentence_ids()->Assign(ids.begin(),
                                                                               ids.end());
  }
  setup.mutable_setup()->mutable_default_params()->set_k(flags.k);
  const int rows = flags.subset_sentences * flags.beam;
  std::vector<v1::StreamRequest> steps(4);  // a few query matrices, reused
  for (size_t i = 0; i < steps.size(); ++i) {
    v1::SearchRequest* step = steps[i].mutable_step();
    EncodeMatrix(testing::RandomQueries(rows, flags.dim, static_cast<uint32_t>(i)).view(), dtype,
                 step->mutable_queries());
    for (int r = 0; r < rows; ++r) step->add_row_group(r / flags.beam);
  }
  auto stub = testing::Connect(address);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(600)));
  auto stream = stub->SearchStream(&context);
  KNNSERVE_CHECK(stream->Write(setup), "setup");
  v1::SearchResponse response;
  std::vector<absl::Duration> times;
  for (int i = 0; i <= flags.subset_steps; ++i) {
    const absl::Time start = absl::Now();
    KNNSERVE_CHECK(stream->Write(steps[i % steps.size()]) && stream->Read(&response), "step");
    KNNSERVE_CHECK(response.error_code() == 0, response.error_message().c_str());
    if (i > 0) times.push_back(absl::Now() - start);
  }
  stream->WritesDone();
  KNNSERVE_CHECK(stream->Finish().ok(), "stream");
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// A router over 2 shards whose engines answer at once.
struct InstantCluster {
  InstantCluster(const Flags& flags, bool subset_sessions) {
    const int64_t num_sentences = int64_t{flags.subset_sentences} * flags.group_size * 2;
    RouterOptions options = Options(false);
    options.limits = RequestLimits();
    options.subset_sessions = subset_sessions;
    ShardMap map;
    for (int s = 0; s < 2; ++s) {
      shards.push_back(std::make_unique<TestShard>(
          s, std::make_unique<InstantEngine>(flags.dim, num_sentences, s, 2),
          testing::TestShardOptions{.limits = RequestLimits()}));
      map[s].push_back(shards.back()->address());
    }
    router = std::make_unique<TestRouter>(map, options);
  }
  std::vector<std::unique_ptr<TestShard>> shards;
  std::unique_ptr<TestRouter> router;
};

void BenchD(const Flags& flags) {
  std::printf(
      "\n### d) subset stream through the router + 2 shards (instant engines): %d steps of %d x "
      "%d query rows, %d groups x %d sentences, dim %d, k %d\n\n"
      "Median step time; the best of %d interleaved rounds.\n\n"
      "| subset sent | queries | ms per step |\n|---|---|---|\n",
      flags.subset_steps, flags.subset_sentences, flags.beam, flags.subset_sentences,
      flags.group_size, flags.dim, flags.k, flags.subset_rounds);
  struct Config {
    bool sessions;
    v1::DType dtype;
    absl::Duration best = absl::InfiniteDuration();
  };
  std::vector<Config> configs;
  for (const bool sessions : {false, true}) {
    for (const v1::DType dtype : {v1::DTYPE_FP32, v1::DTYPE_FP16}) {
      configs.push_back({sessions, dtype});
    }
  }
  InstantCluster every_step(flags, false);
  InstantCluster once(flags, true);
  for (int round = 0; round < flags.subset_rounds; ++round) {
    for (Config& config : configs) {
      const std::string address = (config.sessions ? once : every_step).router->address();
      config.best = std::min(config.best, SubsetStream(flags, address, config.dtype));
    }
  }
  for (const Config& config : configs) {
    std::printf("| %s | %s | %.3f |\n", config.sessions ? "once per shard" : "every step",
                config.dtype == v1::DTYPE_FP16 ? "fp16" : "fp32",
                absl::ToDoubleMilliseconds(config.best));
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace knnserve

int main(int argc, char** argv) {
  knnserve::InitProcess(argv);
  knnserve::KeepServedBlocksOnTheHeap();  // as knnserve-shard and knnserve-router do
  knnserve::Flags flags;
  std::string parts = "abc";
  CLI::App app{"knnserve service benchmarks"};
  app.add_option("--vectors", flags.vectors)->capture_default_str();
  app.add_option("--dim", flags.dim)->capture_default_str();
  app.add_option("--factory", flags.factory)->capture_default_str();
  app.add_option("--nprobe", flags.nprobe)->capture_default_str();
  app.add_option("--batch", flags.batch)->capture_default_str();
  app.add_option("--k", flags.k)->capture_default_str();
  app.add_option("--seconds", flags.seconds, "per measurement")->capture_default_str();
  app.add_option("--slices", flags.slices,
                 "a) and b): alternating slices per side (the machine's speed drifts)")
      ->capture_default_str();
  app.add_option("--pairs", flags.pairs, "a): in-process / router pairs for the paired overhead")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steady-seconds", flags.steady_seconds, "per steady-rate scenario (c)")
      ->capture_default_str();
  app.add_option("--train-size", flags.train_size)->capture_default_str();
  app.add_option("--work-dir", flags.work_dir, "where built indexes are kept")
      ->capture_default_str();
  app.add_option("--subset-steps", flags.subset_steps, "steps per stream (d)")
      ->capture_default_str();
  app.add_option("--subset-rounds", flags.subset_rounds, "streams per configuration (d)")
      ->capture_default_str();
  app.add_option("--shard-batch-threads", flags.shard_batch_threads,
                 "a), b) and s): engine calls each shard runs at once (knnserve-shard "
                 "--batch-threads)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--shard-inline-budget-us", flags.shard_inline_budget_us,
                 "a), b) and s): knnserve-shard --inline-budget-us")
      ->check(CLI::Range(int64_t{0}, int64_t{10'000'000}))
      ->capture_default_str();
  app.add_option("--parts", parts, "which benchmarks to run: any of a, b, c, d, s")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  knnserve::InitLog("bench", knnserve::LogLevel::kWarning);
  if (parts.find('a') != std::string::npos) knnserve::BenchA(flags);
  if (parts.find('b') != std::string::npos) knnserve::BenchB(flags);
  if (parts.find('c') != std::string::npos) knnserve::BenchC(flags);
  if (parts.find('d') != std::string::npos) knnserve::BenchD(flags);
  if (parts.find('s') != std::string::npos) {
    std::printf("\n### s) the service alone\n\n%s",
                knnserve::ServiceAloneLine(flags, absl::Milliseconds(40)).c_str());
  }
  return 0;
}
