// One request to one shard: replica choice, failover and hedging. gRPC C++ implements neither
// hedging nor failover across distinct backends, so this does:
//  - the first attempt goes to ShardGroup::Pick();
//  - a transient failure (UNAVAILABLE, ABORTED, or a cancellation the router did not ask for,
//    e.g. a replica shutting down) is retried on another replica while the deadline allows;
//  - when hedging is on and the shard has another replica, a second attempt is sent after the
//    hedge delay if the first has not answered; the first answer wins and the loser is
//    cancelled (so is everything when the caller cancels);
//  - a request that names a subset_session without its groups is sent again, with them, to a
//    replica that answers that it does not know the session (it never saw it, forgot it, or
//    restarted), within the same deadline.
#ifndef KNNSERVE_SERVER_SHARD_CALL_H_
#define KNNSERVE_SERVER_SHARD_CALL_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "knnserve/v1/retrieval.pb.h"
#include "server/scheduler.h"
#include "server/shard_group.h"
#include "shard/search_backend.h"

namespace knnserve {

struct HedgeOptions {
  bool enabled = true;
  // Fixed hedge delay; zero: the shard's observed p95 (after `min_samples` answers; before
  // that `initial_delay`), never less than `min_delay`.
  absl::Duration delay = absl::ZeroDuration();
  absl::Duration initial_delay = absl::Milliseconds(20);
  absl::Duration min_delay = absl::Milliseconds(1);
  double quantile = 0.95;
  int min_samples = 20;
  // Hedges per shard stay within max_ratio of its requests (at least one), so that a slow period
  // cannot double the load: a hedge is extra work for an already busy cluster.
  double max_ratio = 0.05;

  absl::Duration DelayFor(const LatencyWindow& latency) const;
};

// What a shard call sends.
struct ShardRequest {
  std::shared_ptr<const v1::SearchRequest> request;
  // Set when `request` names a subset_session without its groups: builds the same request
  // with them. Called at most once per call, and only when a replica does not know the session.
  std::function<std::shared_ptr<const v1::SearchRequest>()> with_groups;
};

using ShardDone = std::function<void(absl::StatusOr<v1::SearchResponse>)>;

// Starts the call; `done` runs once, on a gRPC or scheduler thread. `shard`, `scheduler` and
// `hedge` must outlive the call; `cancel` cancels every attempt in flight.
void StartShardCall(ShardGroup* shard, ShardRequest request, absl::Time deadline,
                    const std::shared_ptr<CancelToken>& cancel, Scheduler* scheduler,
                    const HedgeOptions* hedge, ShardDone done);

}  // namespace knnserve

#endif  // KNNSERVE_SERVER_SHARD_CALL_H_
