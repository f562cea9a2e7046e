#include "server/shard_group.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace knnserve {
namespace {

constexpr double kEwmaWeight = 0.2;  // weight of the newest sample

ShardMetrics MakeShardMetrics(MetricsRegistry* registry, int32_t shard_id) {
  const std::string shard = absl::StrCat(shard_id);
  return {
      registry->GetCounter("knnserve_shard_requests_total",
                           "Router calls to a shard (after failover and hedging), by result",
                           {{"shard", shard}, {"result", "ok"}}),
      registry->GetCounter("knnserve_shard_requests_total",
                           "Router calls to a shard (after failover and hedging), by result",
                           {{"shard", shard}, {"result", "error"}}),
      registry->GetHistogram("knnserve_shard_request_seconds",
                             "Latency of a router call to a shard", {{"shard", shard}},
                             Histogram::LatencyBounds()),
      registry->GetCounter("knnserve_hedges_sent_total", "Hedged requests sent, by shard",
                           {{"shard", shard}}),
      registry->GetCounter("knnserve_hedges_won_total",
                           "Hedged requests that answered first, by shard", {{"shard", shard}}),
      registry->GetCounter("knnserve_failovers_total",
                           "Retries on another replica after a transient error, by shard",
                           {{"shard", shard}}),
      registry->GetCounter("knnserve_subset_resends_total",
                           "Requests sent again with their subset groups to a replica that did "
                           "not know the subset_session, by shard",
                           {{"shard", shard}}),
  };
}

}  // namespace

Replica::Replica(std::string address, std::shared_ptr<grpc::Channel> channel, Gauge* in_flight)
    : address_(std::move(address)),
      channel_(std::move(channel)),
      stub_(v1::Retrieval::NewStub(channel_)),
      in_flight_(in_flight) {}

absl::Duration Replica::ewma_latency() const {
  return absl::Nanoseconds(ewma_nanos_.load(std::memory_order_relaxed));
}

void Replica::CallStarted() {
  outstanding_.fetch_add(1, std::memory_order_relaxed);
  in_flight_->Add(1);
}

void Replica::CallFinished(absl::Duration latency, Latency kind) {
  outstanding_.fetch_sub(1, std::memory_order_relaxed);
  in_flight_->Add(-1);
  if (kind == Latency::kNone) return;
  const int64_t old = ewma_nanos_.load(std::memory_order_relaxed);
  int64_t sample = absl::ToInt64Nanoseconds(latency);
  // A bound can only raise the average: a hedge cancelled a moment after it was sent says
  // nothing of how fast its replica is.
  if (kind == Latency::kLowerBound) sample = std::max(sample, old);
  // A lost update under contention only drops one sample from the average.
  ewma_nanos_.store(
      old == 0 ? sample : static_cast<int64_t>(kEwmaWeight * sample + (1 - kEwmaWeight) * old),
      std::memory_order_relaxed);
}

ShardGroup::ShardGroup(int32_t shard_id, std::vector<std::unique_ptr<Replica>> replicas,
                       MetricsRegistry* metrics)
    : shard_id_(shard_id),
      replicas_(std::move(replicas)),
      metrics_(MakeShardMetrics(metrics, shard_id)) {}

ShardGroup::~ShardGroup() {
  closing_.Cancel();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* live) { return *live == 0; }, &live_calls_));
}

void ShardGroup::CallBegan() {
  absl::MutexLock lock(&mu_);
  ++live_calls_;
}

void ShardGroup::CallEnded() {
  absl::MutexLock lock(&mu_);
  --live_calls_;
}

Replica* ShardGroup::Pick(const std::vector<Replica*>& exclude) {
  const size_t n = replicas_.size();
  const size_t start = rotation_.fetch_add(1, std::memory_order_relaxed) % n;
  Replica* best = nullptr;
  auto key = [](const Replica* r) {
    return std::make_tuple(!r->healthy(), r->outstanding(), r->ewma_latency());
  };
  for (size_t i = 0; i < n; ++i) {
    Replica* candidate = replicas_[(start + i) % n].get();
    if (candidate->verdict() != Replica::Verdict::kMatches ||
        std::find(exclude.begin(), exclude.end(), candidate) != exclude.end()) {
      continue;
    }
    if (best == nullptr || key(candidate) < key(best)) best = candidate;
  }
  return best;
}

bool ShardGroup::TakeHedge(double max_ratio) {
  // One hedge is always allowed, so that a stuck replica is hedged even on a shard's first
  // requests; beyond it, hedges stay within max_ratio of the requests (no "+1" per shard that
  // short runs over many shards would add up).
  const double budget =
      std::max(1.0, max_ratio * static_cast<double>(requests_.load(std::memory_order_relaxed)));
  int64_t hedges = hedges_.load(std::memory_order_relaxed);
  while (hedges + 1 <= budget) {
    if (hedges_.compare_exchange_weak(hedges, hedges + 1, std::memory_order_relaxed)) {
      return true;
    }
  }
  return false;
}

std::optional<v1::InfoResponse> ShardGroup::info() const {
  absl::MutexLock lock(&mu_);
  return info_;
}

void ShardGroup::set_info(v1::InfoResponse info) {
  absl::MutexLock lock(&mu_);
  info_ = std::move(info);
}

}  // namespace knnserve
