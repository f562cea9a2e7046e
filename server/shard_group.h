// One shard as the router sees it: its replicas (a gRPC channel each, calls in flight, latency,
// health from the last probe), what the shard serves (its Info), recent latencies for the hedge
// delay, and its metrics.
#ifndef KNNSERVE_SERVER_SHARD_GROUP_H_
#define KNNSERVE_SERVER_SHARD_GROUP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "knnserve/v1/retrieval.grpc.pb.h"
#include "server/latency_window.h"
#include "shard/metrics.h"
#include "shard/search_backend.h"

namespace knnserve {

// One replica endpoint. Thread-safe.
class Replica {
 public:
  Replica(std::string address, std::shared_ptr<grpc::Channel> channel, Gauge* in_flight);

  const std::string& address() const { return address_; }
  v1::Retrieval::Stub* stub() { return stub_.get(); }

  int outstanding() const { return outstanding_.load(std::memory_order_relaxed); }
  // Exponentially weighted moving average of successful call latencies (0 before any).
  absl::Duration ewma_latency() const;
  bool healthy() const { return healthy_.load(std::memory_order_relaxed); }
  void set_healthy(bool healthy) { healthy_.store(healthy, std::memory_order_relaxed); }
  // What its last answered Info showed: unknown before any, then whether it serves what the
  // shard map lists it for. Calls go only to replicas that match.
  enum class Verdict { kUnknown, kMatches, kMismatch };
  Verdict verdict() const { return verdict_.load(std::memory_order_relaxed); }
  void set_verdict(Verdict verdict) { verdict_.store(verdict, std::memory_order_relaxed); }

  // What a finished call's time says of the replica's latency.
  enum class Latency {
    kNone,        // nothing (the call failed)
    kExact,       // it answered in this long
    kLowerBound,  // it was cancelled after this long: it would have taken at least as long
  };
  void CallStarted();
  // Folds `latency` into the average as `kind` says.
  void CallFinished(absl::Duration latency, Latency kind);

 private:
  const std::string address_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Retrieval::Stub> stub_;
  Gauge* const in_flight_;
  std::atomic<int> outstanding_{0};
  std::atomic<int64_t> ewma_nanos_{0};
  std::atomic<bool> healthy_{true};  // optimistic until the first probe says otherwise
  std::atomic<Verdict> verdict_{Verdict::kUnknown};
};

struct ShardMetrics {
  Counter* requests_ok;
  Counter* requests_failed;
  Histogram* latency;
  Counter* hedges_sent;
  Counter* hedges_won;
  Counter* failovers;
  Counter* subset_resends;
};

// Thread-safe.
class ShardGroup {
 public:
  ShardGroup(int32_t shard_id, std::vector<std::unique_ptr<Replica>> replicas,
             MetricsRegistry* metrics);
  // Cancels the shard calls still alive (CallBegan without CallEnded) through closing(), and
  // waits for them: an attempt's callback reads its replica, and a cancelled loser's can run
  // after the caller's answer.
  ~ShardGroup();

  int32_t shard_id() const { return shard_id_; }
  const std::vector<std::unique_ptr<Replica>>& replicas() const { return replicas_; }
  const ShardMetrics& metrics() const { return metrics_; }
  LatencyWindow& latency() { return latency_; }

  // The replica to call next among those whose Info matched (Replica::verdict), skipping
  // `exclude`: healthy before
  // unhealthy, then fewest calls in flight, then lowest latency average, then round robin.
  // nullptr when none is left.
  Replica* Pick(const std::vector<Replica*>& exclude);

  // A shard call (StartShardCall) holds the group and its replicas from CallBegan to CallEnded,
  // and cancels its attempts when closing() is cancelled.
  void CallBegan();
  void CallEnded();
  CancelToken& closing() { return closing_; }

  // Counts a request to this shard (for the hedge budget).
  void CountRequest() { requests_.fetch_add(1, std::memory_order_relaxed); }
  // Takes one hedge from the budget (hedges <= max(1, max_ratio * requests)); false when spent.
  bool TakeHedge(double max_ratio);

  // The Info its replicas agree on, once one has answered (Router::ProbeShard).
  std::optional<v1::InfoResponse> info() const;
  void set_info(v1::InfoResponse info);

 private:
  const int32_t shard_id_;
  const std::vector<std::unique_ptr<Replica>> replicas_;
  const ShardMetrics metrics_;
  LatencyWindow latency_;
  std::atomic<uint32_t> rotation_{0};
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> hedges_{0};
  mutable absl::Mutex mu_;
  std::optional<v1::InfoResponse> info_ ABSL_GUARDED_BY(mu_);
  int live_calls_ ABSL_GUARDED_BY(mu_) = 0;
  CancelToken closing_;
};

}  // namespace knnserve

#endif  // KNNSERVE_SERVER_SHARD_GROUP_H_
