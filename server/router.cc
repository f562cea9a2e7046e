#include "server/router.h"

#include <algorithm>
#include <atomic>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/topk.h"
#include "common/wire.h"
#include "shard/log.h"

namespace knnserve {

struct Router::Topology {
  IndexShape shape;
  Metric metric = Metric::kL2;
  v1::InfoResponse info;  // aggregated; limits are added by the service
  // Per shard (in shards_ order): what it serves.
  std::vector<v1::ShardInfo> ranges;
};

namespace {

void AddSubsetGroups(const SubsetGroups& groups, v1::SearchRequest* request) {
  for (const std::vector<int64_t>& group : groups) {
    request->add_subset_groups()->mutable_sentence_ids()->Assign(group.begin(), group.end());
  }
}

// The request every shard `query` needs gets, the queries in the dtype they came in: packed
// queries are moved into it as they are (`*query` keeps none), decoded ones encoded. A subset
// query that names a session (when `use_sessions`) goes under the token minted for its groups
// (SearchQuery::subset_session) without them, and with the means to add them for a replica that
// does not know the token, unless the groups came with the query: no replica knows a token just
// minted.
ShardRequest MakeShardRequest(SearchQuery* query, bool use_sessions) {
  auto request = std::make_shared<v1::SearchRequest>();
  if (query->packed_queries.has_value()) {
    *request->mutable_queries() = std::move(*query->packed_queries);
    query->packed_queries.reset();
  } else {
    EncodeMatrix(query->queries.view(), query->queries_dtype, request->mutable_queries());
  }
  EncodeParams(query->params, request->mutable_params());
  request->set_request_id(query->request_id);
  if (!query->is_subset()) return {std::move(request), nullptr};
  request->mutable_row_group()->Assign(query->row_group.begin(), query->row_group.end());
  if (!use_sessions || query->subset_session.empty()) {
    AddSubsetGroups(*query->subset_groups, request.get());
    return {std::move(request), nullptr};
  }
  request->set_subset_session(query->subset_session);
  if (query->declares_groups) {
    AddSubsetGroups(*query->subset_groups, request.get());
    return {std::move(request), nullptr};
  }
  auto with_groups = [lean = std::shared_ptr<const v1::SearchRequest>(request),
                      groups = query->subset_groups] {
    auto full = std::make_shared<v1::SearchRequest>(*lean);
    AddSubsetGroups(*groups, full.get());
    return std::shared_ptr<const v1::SearchRequest>(std::move(full));
  };
  return {std::move(request), std::move(with_groups)};
}

// A shard's answer to a query of `rows` rows. A malformed one is the shard's fault, not the
// caller's (DecodeNeighbors says INVALID_ARGUMENT): INTERNAL, a gap reported or tolerated as such.
absl::StatusOr<Neighbors> DecodeShardAnswer(const v1::SearchResponse& response, int64_t rows) {
  absl::StatusOr<Neighbors> neighbors = DecodeNeighbors(response);
  if (!neighbors.ok()) {
    return absl::InternalError(absl::StrCat("malformed answer: ", neighbors.status().message()));
  }
  if (neighbors->rows != rows) {
    return absl::InternalError(
        absl::StrCat("malformed answer: ", neighbors->rows, " rows for a query of ", rows));
  }
  return neighbors;
}

// Whether a shard's failure leaves a gap (reported in Coverage, tolerated with allow_partial)
// rather than being the caller's fault (then every shard would say the same: pass it on).
bool IsGap(absl::StatusCode code) {
  return code != absl::StatusCode::kInvalidArgument &&
         code != absl::StatusCode::kFailedPrecondition &&
         code != absl::StatusCode::kResourceExhausted;
}

v1::DegradedReason ReasonFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      return v1::DEGRADED_REASON_TIMEOUT;
    case absl::StatusCode::kUnavailable:
      if (absl::StrContains(status.message(), "loading")) return v1::DEGRADED_REASON_LOADING;
      if (absl::StrContains(status.message(), kShardOverloaded)) {
        return v1::DEGRADED_REASON_OVERLOADED;
      }
      return v1::DEGRADED_REASON_SHARD_DOWN;
    default:
      return v1::DEGRADED_REASON_ERROR;
  }
}

// The answers of one request's shard calls, merged when the last one arrives. Thread-safe:
// each slot is written once, by the call that owns it, before the countdown.
class FanOut {
 public:
  FanOut(std::vector<const v1::ShardInfo*> targets, const SearchQuery& query, Metric metric,
         SearchDone done)
      : targets_(std::move(targets)),
        results_(targets_.size()),
        remaining_(static_cast<int>(targets_.size())),
        rows_(query.rows()),
        k_(query.params.k),
        subset_(query.is_subset()),
        allow_partial_(query.allow_partial),
        metric_(metric),
        done_(std::move(done)) {}

  void Done(size_t slot, absl::StatusOr<v1::SearchResponse> result) {
    results_[slot] = std::move(result);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_(Merge());
  }

 private:
  absl::StatusOr<SearchAnswer> Merge() {
    SearchAnswer answer;
    v1::Coverage& coverage = answer.coverage;
    coverage.set_shards_asked(static_cast<int>(targets_.size()));
    std::vector<Neighbors> parts;
    std::vector<std::string> missing;
    bool all_timeouts = true;
    for (size_t i = 0; i < targets_.size(); ++i) {
      const v1::ShardInfo& shard = *targets_[i];
      absl::StatusOr<v1::SearchResponse>& result = results_[i];
      if (result.ok()) {
        absl::StatusOr<Neighbors> neighbors = DecodeShardAnswer(*result, rows_);
        if (!neighbors.ok()) {
          result = neighbors.status();
        } else {
          parts.push_back(*std::move(neighbors));
        }
      }
      if (result.ok()) {
        const v1::Coverage& part = result->coverage();
        coverage.set_shards_answered(coverage.shards_answered() + 1);
        coverage.set_vectors_searched(coverage.vectors_searched() + part.vectors_searched());
        coverage.set_vectors_total(coverage.vectors_total() + part.vectors_total());
        for (const v1::DegradedShard& degraded : part.degraded()) {
          *coverage.add_degraded() = degraded;
        }
        continue;
      }
      const absl::Status& status = result.status();
      if (!IsGap(status.code())) {
        return absl::Status(status.code(),
                            absl::StrCat("shard ", shard.shard_id(), ": ", status.message()));
      }
      // The gap's size is known for a full search; for a subset search it would need the
      // missing shard's sentence lengths, so only what answered is counted.
      if (!subset_) {
        coverage.set_vectors_total(coverage.vectors_total() + shard.id_end() - shard.id_begin());
      }
      v1::DegradedShard* degraded = coverage.add_degraded();
      degraded->set_shard_id(shard.shard_id());
      degraded->set_reason(ReasonFor(status));
      degraded->set_detail(std::string(status.message()));
      all_timeouts = all_timeouts && degraded->reason() == v1::DEGRADED_REASON_TIMEOUT;
      missing.push_back(absl::StrCat("shard ", shard.shard_id(), " (", status.message(), ")"));
    }
    if (!missing.empty() && !allow_partial_) {
      const std::string message = absl::StrCat(missing.size(), " of ", targets_.size(),
                                               " shards missing: ", absl::StrJoin(missing, "; "));
      return all_timeouts ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
    }
    if (parts.empty()) {
      answer.neighbors = Neighbors::Missing(rows_, k_, metric_, /*with_values=*/false);
      return answer;
    }
    if (parts.size() == 1 && IsMergedTopK(parts.front(), k_, metric_)) {
      answer.neighbors = std::move(parts.front());  // what merging it alone would return
      return answer;
    }
    std::vector<const Neighbors*> pointers;
    for (const Neighbors& part : parts) pointers.push_back(&part);
    ASSIGN_OR_RETURN(answer.neighbors, MergeTopK(pointers, k_, metric_));
    return answer;
  }

  const std::vector<const v1::ShardInfo*> targets_;
  std::vector<absl::StatusOr<v1::SearchResponse>> results_;
  std::atomic<int> remaining_;
  const int64_t rows_;
  const int k_;
  const bool subset_;
  const bool allow_partial_;
  const Metric metric_;
  const SearchDone done_;
};

// Whether two Infos describe slices of one index (its dimension, metric and sizes).
bool SameIndex(const v1::InfoResponse& a, const v1::InfoResponse& b) {
  return a.dim() == b.dim() && a.metric() == b.metric() && a.total_vectors() == b.total_vectors() &&
         a.num_sentences() == b.num_sentences();
}

// Why `info` (a replica's answer) does not serve shard `shard_id` as `agreed` (the Info of the
// shard's first matching replica, if any) does; empty when it does.
std::string ReplicaMismatch(int32_t shard_id, const v1::InfoResponse& info,
                            const v1::InfoResponse* agreed) {
  if (info.shards_size() != 1) {
    return absl::StrCat("it answers for ", info.shards_size(),
                        " shards (a router?); the shard map lists shard servers");
  }
  const v1::ShardInfo& slice = info.shards(0);
  if (slice.shard_id() != shard_id) {
    return absl::StrCat("it serves shard ", slice.shard_id(), ", the shard map lists it as shard ",
                        shard_id);
  }
  if (agreed == nullptr) return "";
  const v1::ShardInfo& other = agreed->shards(0);
  if (!SameIndex(info, *agreed) || info.factory() != agreed->factory() ||
      info.subset_only() != agreed->subset_only() || slice.id_begin() != other.id_begin() ||
      slice.id_end() != other.id_end() || slice.sentence_begin() != other.sentence_begin() ||
      slice.sentence_end() != other.sentence_end()) {
    const auto describe = [](const v1::InfoResponse& i, const v1::ShardInfo& r) {
      return absl::StrCat("ids [", r.id_begin(), ", ", r.id_end(), ") of ", i.total_vectors(),
                          ", sentences [", r.sentence_begin(), ", ", r.sentence_end(), ") of ",
                          i.num_sentences(), " (", i.factory(), ", dimension ", i.dim(),
                          i.subset_only() ? ", subset only" : "", ")");
    };
    return absl::StrCat("it serves ", describe(info, slice), ", the shard's reference replica ",
                        describe(*agreed, other));
  }
  return "";
}

// Why the shards' slices (id ranges, and sentence ranges when the index has sentences) do not
// cover the index exactly once; empty when they do.
std::string CoverageGap(const std::vector<v1::ShardInfo>& ranges, const v1::InfoResponse& info) {
  struct Range {
    int64_t begin, end;
    int32_t shard;
  };
  const auto check = [&](const char* what, int64_t total, auto range_of) -> std::string {
    std::vector<Range> sorted;
    for (const v1::ShardInfo& r : ranges) {
      const Range range = range_of(r);
      if (range.end > range.begin) sorted.push_back(range);  // an empty slice covers nothing
    }
    std::sort(sorted.begin(), sorted.end(), [](const Range& a, const Range& b) {
      return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
    });
    int64_t covered = 0;
    for (size_t i = 0; i < sorted.size(); ++i) {
      const Range& r = sorted[i];
      if (r.begin > covered) {
        return absl::StrCat(what, " [", covered, ", ", r.begin, ") are in no shard of the map");
      }
      if (r.begin < covered) {
        return absl::StrCat("shards ", sorted[i - 1].shard, " and ", r.shard, " both hold ", what,
                            " from ", r.begin, " on");
      }
      covered = r.end;
    }
    if (covered != total) {
      return absl::StrCat(what, " [", covered, ", ", total, ") are in no shard of the map");
    }
    return "";
  };
  std::string gap = check("ids", info.total_vectors(), [](const v1::ShardInfo& r) {
    return Range{r.id_begin(), r.id_end(), r.shard_id()};
  });
  if (gap.empty() && info.num_sentences() > 0) {
    gap = check("sentences", info.num_sentences(), [](const v1::ShardInfo& r) {
      return Range{r.sentence_begin(), r.sentence_end(), r.shard_id()};
    });
  }
  return gap;
}

// A full search needs every shard's faiss index; subset-only shards were started without it.
absl::Status SubsetOnlyError(const std::vector<v1::ShardInfo>& ranges) {
  std::vector<int> shards;
  for (const v1::ShardInfo& range : ranges) {
    if (range.subset_only()) shards.push_back(range.shard_id());
  }
  return absl::FailedPreconditionError(
      absl::StrCat("full search: shard", shards.size() == 1 ? " " : "s ",
                   absl::StrJoin(shards, ", "), shards.size() == 1 ? " serves" : " serve",
                   " subset searches only (knnserve-shard --subset-only)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Router>> Router::Create(const ShardMap& map, RouterOptions options,
                                                       MetricsRegistry* metrics,
                                                       std::function<void(bool)> on_health) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   MakeChannelCredentials(options.shard_tls));
  const grpc::ChannelArguments args = MakeChannelArguments(
      options.limits.MaxMessageBytes(kRouterMaxDim), options.shard_tls_server_name);
  std::vector<std::unique_ptr<ShardGroup>> shards;
  for (const auto& [shard_id, addresses] : map) {
    std::vector<std::unique_ptr<Replica>> replicas;
    for (const std::string& address : addresses) {
      Gauge* in_flight = metrics->GetGauge(
          "knnserve_replica_in_flight", "Router calls in flight, by shard and replica",
          {{"shard", absl::StrCat(shard_id)}, {"replica", address}});
      replicas.push_back(std::make_unique<Replica>(
          address, grpc::CreateCustomChannel(address, credentials, args), in_flight));
    }
    shards.push_back(std::make_unique<ShardGroup>(shard_id, std::move(replicas), metrics));
  }
  auto router = absl::WrapUnique(new Router(std::move(options), std::move(shards)));
  router->on_health_ = std::move(on_health);
  return router;
}

void Router::StartProbing() {
  prober_ = std::thread([this] { ProbeLoop(); });
}

Router::Router(RouterOptions options, std::vector<std::unique_ptr<ShardGroup>> shards)
    : options_(std::move(options)), shards_(std::move(shards)) {}

Router::~Router() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (prober_.joinable()) prober_.join();
}

void Router::ProbeLoop() {
  while (true) {
    ProbeOnce();
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.probe_interval)) return;
  }
}

// A replica must serve what the shard map lists it for: one shard, of that id, and the same
// slice of the same index as the shard's reference Info: the one agreed before, while a replica
// still serves it, else the first replica (in map order) whose shard id is right. One that does
// not gets no calls (a wrong map entry would otherwise answer with another shard's vectors, or
// twice with the same ones), and its reason is logged as an error. A replica's verdict changes
// only when it answers Info; one that never answered gets no calls either.
struct Router::ProbeAnswer {
  Replica* replica = nullptr;
  grpc::ClientContext context;
  grpc::Status status;
  v1::InfoResponse info;
};

void Router::JudgeShard(ShardGroup* shard,
                        const std::vector<std::unique_ptr<ProbeAnswer>>& answers) {
  const int32_t id = shard->shard_id();
  const std::optional<v1::InfoResponse> previous = shard->info();
  std::optional<v1::InfoResponse> reference;
  const auto find_reference = [&](const v1::InfoResponse* against) {
    for (const auto& a : answers) {
      if (a->status.ok() && ReplicaMismatch(id, a->info, against).empty()) {
        reference = against != nullptr ? *against : a->info;
        return;
      }
    }
  };
  if (previous.has_value()) find_reference(&*previous);
  if (!reference.has_value()) find_reference(nullptr);
  if (previous.has_value() && reference.has_value()) {
    if (const std::string change = ReplicaMismatch(id, *reference, &*previous); !change.empty()) {
      Log(LogLevel::kError, "no replica serves the shard's slice as before: taking a new one",
          {{"shard", id}, {"error", change}});
    }
  }
  for (const auto& a : answers) {
    Replica& replica = *a->replica;
    if (a->status.ok()) {
      const std::string mismatch =
          ReplicaMismatch(id, a->info, reference.has_value() ? &*reference : nullptr);
      if (!mismatch.empty() && replica.verdict() != Replica::Verdict::kMismatch) {
        Log(LogLevel::kError, "replica serves something else than the shard map says",
            {{"shard", id}, {"replica", replica.address()}, {"error", mismatch}});
      }
      replica.set_verdict(mismatch.empty() ? Replica::Verdict::kMatches
                                           : Replica::Verdict::kMismatch);
    }
    const bool healthy = a->status.ok() && replica.verdict() == Replica::Verdict::kMatches;
    if (healthy != replica.healthy() && replica.verdict() != Replica::Verdict::kMismatch) {
      Log(healthy ? LogLevel::kInfo : LogLevel::kWarning, healthy ? "replica up" : "replica down",
          {{"shard", id}, {"replica", replica.address()}, {"error", a->status.error_message()}});
    }
    replica.set_healthy(healthy);
  }
  if (reference.has_value()) shard->set_info(*std::move(reference));
}

// Every replica is asked at once: a round takes one probe timeout however many replicas are
// unreachable (asked one after another, each unreachable one added its timeout to every health
// and topology update).
void Router::ProbeOnce() {
  const v1::InfoRequest request;
  const absl::Time deadline = absl::Now() + options_.probe_timeout;
  std::vector<std::vector<std::unique_ptr<ProbeAnswer>>> answers(shards_.size());
  size_t calls = 0;
  for (const auto& shard : shards_) calls += shard->replicas().size();
  absl::BlockingCounter pending(static_cast<int>(calls));
  for (size_t s = 0; s < shards_.size(); ++s) {
    for (const auto& replica : shards_[s]->replicas()) {
      ProbeAnswer* answer = answers[s].emplace_back(std::make_unique<ProbeAnswer>()).get();
      answer->replica = replica.get();
      answer->context.set_deadline(absl::ToChronoTime(deadline));
      replica->stub()->async()->Info(&answer->context, &request, &answer->info,
                                     [answer, &pending](grpc::Status status) {
                                       answer->status = std::move(status);
                                       pending.DecrementCount();
                                     });
    }
  }
  pending.Wait();
  for (size_t s = 0; s < shards_.size(); ++s) JudgeShard(shards_[s].get(), answers[s]);
  Update();
}

void Router::Update() {
  auto topology = std::make_shared<Topology>();
  std::string reason;   // the shards cannot serve together as they are
  std::string waiting;  // a shard has not answered yet
  bool all_replicated = true;
  for (const auto& shard : shards_) {
    all_replicated =
        all_replicated && std::any_of(shard->replicas().begin(), shard->replicas().end(),
                                      [](const auto& r) { return r->healthy(); });
    if (std::all_of(shard->replicas().begin(), shard->replicas().end(),
                    [](const auto& r) { return r->verdict() == Replica::Verdict::kMismatch; })) {
      reason = absl::StrCat("no replica of shard ", shard->shard_id(),
                            " serves it as the shard map lists it");
      break;
    }
    std::optional<v1::InfoResponse> info = shard->info();
    if (!info.has_value()) {
      waiting = absl::StrCat("shard ", shard->shard_id(), " has not answered Info yet");
      break;
    }
    v1::InfoResponse& all = topology->info;
    if (topology->ranges.empty()) {
      all = *info;
      all.clear_shards();
    } else if (!SameIndex(*info, all)) {
      reason = absl::StrCat("shard ", shard->shard_id(),
                            " serves a different index (dim, metric or size) than shard ",
                            shards_.front()->shard_id());
      break;
    }
    NarrowLimits(info->limits(), all.mutable_limits());
    all.set_supports_subset(all.supports_subset() && info->supports_subset());
    all.set_subset_only(all.subset_only() || info->subset_only());
    v1::ShardInfo range = info->shards(0);
    range.set_shard_id(shard->shard_id());
    range.clear_replicas();
    for (const auto& replica : shard->replicas()) range.add_replicas(replica->address());
    *all.add_shards() = range;
    topology->ranges.push_back(std::move(range));
  }
  // A reason other than a shard that has not answered yet is the shard map's (or the shards')
  // configuration: logged as an error once, as it will not go away by waiting.
  if (reason.empty() && waiting.empty()) reason = CoverageGap(topology->ranges, topology->info);
  const bool misconfigured = !reason.empty();
  if (misconfigured) {
    reason = absl::StrCat(reason, " (check the shard map and the shards' --index and --shard)");
  } else {
    reason = waiting;
  }
  if (reason.empty()) {
    topology->shape = {topology->info.dim(), topology->info.num_sentences()};
    v1::Limits* limits = topology->info.mutable_limits();
    limits->set_max_message_bytes(
        std::min(limits->max_message_bytes(), options_.limits.MaxMessageBytes(kRouterMaxDim)));
    absl::StatusOr<Metric> metric = MetricFromProto(topology->info.metric());
    if (metric.ok())
      topology->metric = *metric;
    else
      reason = std::string(metric.status().message());
  }
  const bool healthy = reason.empty() && all_replicated;
  bool changed = false;
  bool new_reason = false;
  {
    absl::MutexLock lock(&mu_);
    topology_ = reason.empty() ? std::move(topology) : nullptr;
    new_reason = reason != not_ready_reason_;
    not_ready_reason_ = reason;
    changed = healthy != healthy_;
    healthy_ = healthy;
  }
  if (misconfigured && new_reason) {
    Log(LogLevel::kError, "the shards cannot serve together", {{"reason", reason}});
  }
  if (changed) {
    Log(LogLevel::kInfo, healthy ? "serving" : "not serving", {{"reason", reason}});
    if (on_health_) on_health_(healthy);
  }
}

bool Router::healthy() const {
  absl::MutexLock lock(&mu_);
  return healthy_;
}

absl::StatusOr<std::shared_ptr<const Router::Topology>> Router::topology() const {
  absl::MutexLock lock(&mu_);
  // The reason is read under the same lock as the topology: a probe may install one between
  // two locks.
  if (topology_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("router is loading: ", not_ready_reason_));
  }
  return topology_;
}

absl::StatusOr<IndexShape> Router::Shape() const {
  ASSIGN_OR_RETURN(std::shared_ptr<const Topology> topology, this->topology());
  return topology->shape;
}

absl::StatusOr<v1::InfoResponse> Router::Info() const {
  ASSIGN_OR_RETURN(std::shared_ptr<const Topology> topology, this->topology());
  return topology->info;
}

// A request that allows partial results gets them even when its own deadline comes first: its
// shard calls end a tenth of its time (at most 250 ms) before it, which leaves the merge and the
// answer time to reach the caller. With the caller's deadline itself the shard calls, and the
// caller, would expire together, and the caller would get DEADLINE_EXCEEDED instead.
absl::Time Router::ShardDeadline(const SearchCall& call) const {
  const absl::Time now = absl::Now();
  const absl::Time router_deadline = now + options_.max_timeout;
  if (!call.query.allow_partial || call.deadline == absl::InfiniteFuture()) {
    return std::min(call.deadline, router_deadline);
  }
  const absl::Duration reserve =
      std::clamp((call.deadline - now) / 10, absl::ZeroDuration(), absl::Milliseconds(250));
  return std::min(router_deadline, call.deadline - reserve);
}

std::vector<size_t> Router::Targets(const Topology& topology, const SearchQuery& query) const {
  std::vector<size_t> targets;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const v1::ShardInfo& range = topology.ranges[i];
    bool needed = !query.is_subset();
    for (size_t g = 0; !needed && g < query.subset_groups->size(); ++g) {
      const std::vector<int64_t>& group = (*query.subset_groups)[g];
      needed = std::any_of(group.begin(), group.end(), [&range](int64_t sentence) {
        return sentence >= range.sentence_begin() && sentence < range.sentence_end();
      });
    }
    if (needed) targets.push_back(i);
  }
  return targets;
}

void Router::Search(SearchCall call, SearchDone done) {
  absl::StatusOr<std::shared_ptr<const Topology>> ready = this->topology();
  if (!ready.ok()) {
    done(ready.status());
    return;
  }
  const std::shared_ptr<const Topology> topology = *std::move(ready);
  if (!call.query.is_subset() && topology->info.subset_only()) {
    done(SubsetOnlyError(topology->ranges));
    return;
  }
  const std::vector<size_t> targets = Targets(*topology, call.query);
  if (targets.empty()) {  // only when the shards' sentence ranges leave gaps
    done(absl::FailedPreconditionError("no shard holds any of the requested sentences"));
    return;
  }
  std::vector<const v1::ShardInfo*> ranges;
  for (size_t target : targets) ranges.push_back(&topology->ranges[target]);
  const absl::Time deadline = ShardDeadline(call);
  // The callbacks keep the topology (which `ranges` point into) alive.
  auto fan_out = std::make_shared<FanOut>(
      std::move(ranges), call.query, topology->metric,
      [topology, done = std::move(done)](absl::StatusOr<SearchAnswer> answer) {
        done(std::move(answer));
      });
  // After the FanOut, which reads the query's row count: the request takes its queries.
  const ShardRequest request = MakeShardRequest(&call.query, options_.subset_sessions);
  for (size_t i = 0; i < targets.size(); ++i) {
    StartShardCall(shards_[targets[i]].get(), request, deadline, call.cancel, &scheduler_,
                   &options_.hedge, [fan_out, i](absl::StatusOr<v1::SearchResponse> result) {
                     fan_out->Done(i, std::move(result));
                   });
  }
}

}  // namespace knnserve
