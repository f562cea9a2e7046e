// The router: the Retrieval backend of knnserve-router. It fans each query out to the shards
// that hold what it asks for (all of them for a full search; for a subset search only those
// whose sentence range holds a requested sentence), in parallel, with the caller's deadline,
// through StartShardCall (replica choice, failover, hedging), merges the shards' top-k lists,
// and reports Coverage. Without every needed shard a request fails with UNAVAILABLE (or
// DEADLINE_EXCEEDED) naming the missing shards, unless it allows partial results. A subset
// query that names a subset_session (a stream's steps do) goes to the shards without its
// groups; a replica that does not know the session is sent them again (StartShardCall).
// Queries travel to the shards in the dtype they arrived in.
//
// A background prober calls Info on every replica (health, and what each shard serves); the
// router serves once every shard has answered and the shards agree on dim and metric, and it
// reports healthy while every shard has a replica that answered its last probe.
#ifndef KNNSERVE_SERVER_ROUTER_H_
#define KNNSERVE_SERVER_ROUTER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/request.h"
#include "server/scheduler.h"
#include "server/shard_call.h"
#include "server/shard_group.h"
#include "server/shard_map.h"
#include "shard/metrics.h"
#include "shard/rpc_server.h"
#include "shard/search_backend.h"

namespace knnserve {

// A router's listening side and its channels to the shards accept the largest messages the
// limits allow for indexes up to this dimension: it learns the real dimension from the shards
// only after it starts. Beyond it, Info advertises the smaller message limit it enforces.
inline constexpr int kRouterMaxDim = 4096;

struct RouterOptions {
  RequestLimits limits;
  HedgeOptions hedge;
  // Applied when the caller sets no deadline (or a later one).
  absl::Duration max_timeout = absl::Seconds(30);
  // Subset search on a stream names the stream's subset to the shards by a subset_session
  // token: each replica gets the groups once (again after it forgets them), not at every
  // step. false: every request carries its groups, for shards that predate subset_session.
  bool subset_sessions = true;
  absl::Duration probe_interval = absl::Seconds(1);
  absl::Duration probe_timeout = absl::Seconds(1);
  // Credentials for the router -> shard channels, and the name shard certificates carry when
  // it is not the address's host.
  TlsFiles shard_tls;
  std::string shard_tls_server_name;
};

// Thread-safe.
class Router : public SearchBackend {
 public:
  // `metrics` must outlive the router. `on_health` (may be empty) is called from the prober
  // thread whenever the aggregated health changes.
  static absl::StatusOr<std::unique_ptr<Router>> Create(const ShardMap& map, RouterOptions options,
                                                        MetricsRegistry* metrics,
                                                        std::function<void(bool)> on_health);
  // Starts probing the shards' replicas (every probe_interval) in a thread of its own: until
  // then the router knows no topology and is not healthy. REQUIRES: called at most once.
  void StartProbing();
  ~Router() override;

  absl::StatusOr<IndexShape> Shape() const override;
  absl::StatusOr<v1::InfoResponse> Info() const override;
  // Packed: the router forwards the queries' bytes to the shards without decoding them.
  QueryForm query_form() const override { return QueryForm::kPacked; }
  void Search(SearchCall call, SearchDone done) override;

  // Probes every replica once, now, all at once (the prober does so every probe_interval).
  void ProbeOnce();
  bool healthy() const;

 private:
  struct Topology;  // what the shards serve together, once known

  Router(RouterOptions options, std::vector<std::unique_ptr<ShardGroup>> shards);
  void ProbeLoop();
  struct ProbeAnswer;
  // Verdicts and health of `shard`'s replicas from their answers (one per replica, in order).
  void JudgeShard(ShardGroup* shard, const std::vector<std::unique_ptr<ProbeAnswer>>& answers);
  // Recomputes topology and health from the shards' infos and replica health.
  void Update();
  // The shards' topology once every shard has answered, else UNAVAILABLE with the reason.
  absl::StatusOr<std::shared_ptr<const Topology>> topology() const;
  // When the shard calls of `call` end.
  absl::Time ShardDeadline(const SearchCall& call) const;
  // Indexes into shards_ of the shards `query` needs.
  std::vector<size_t> Targets(const Topology& topology, const SearchQuery& query) const;

  const RouterOptions options_;
  const std::vector<std::unique_ptr<ShardGroup>> shards_;
  std::function<void(bool)> on_health_;
  Scheduler scheduler_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const Topology> topology_ ABSL_GUARDED_BY(mu_);
  std::string not_ready_reason_ ABSL_GUARDED_BY(mu_) = "waiting for the first probe";
  bool healthy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread prober_;
};

}  // namespace knnserve

#endif  // KNNSERVE_SERVER_ROUTER_H_
