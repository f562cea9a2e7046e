#include "server/shard_call.h"

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/request.h"

namespace knnserve {
namespace {

// Thread-safe; kept alive by the callbacks of its attempts and timers.
class ShardCall : public std::enable_shared_from_this<ShardCall> {
 public:
  ShardCall(ShardGroup* shard, ShardRequest request, absl::Time deadline, Scheduler* scheduler,
            const HedgeOptions* hedge, ShardDone done)
      : shard_(shard),
        request_(std::move(request)),
        deadline_(deadline),
        scheduler_(scheduler),
        hedge_(hedge),
        done_(std::move(done)),
        start_(absl::Now()) {
    shard_->CallBegan();
  }
  ~ShardCall() { shard_->CallEnded(); }

  void Start(const std::shared_ptr<CancelToken>& cancel) {
    std::weak_ptr<ShardCall> weak = weak_from_this();
    const auto cancel_all = [weak] {
      if (auto self = weak.lock()) self->CancelAll();
    };
    cancel_ = cancel;
    cancel_id_ = cancel->OnCancel(cancel_all);
    closing_id_ = shard_->closing().OnCancel(cancel_all);
    if (cancel->cancelled()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(absl::CancelledError("the caller cancelled the request"));
      return;
    }
    shard_->CountRequest();
    Replica* first = shard_->Pick({});
    if (first == nullptr) {  // every replica serves something else than the map says
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(absl::UnavailableError(absl::StrCat("no replica serves shard ", shard_->shard_id(),
                                                 " as the shard map lists it")));
      return;
    }
    Launch(first, /*hedge=*/false, request_.request);
    // A hedge after the deadline would be pointless; the timer, which stays queued until it
    // fires, is dropped by then (a long hedge delay kept one per call for its whole length).
    const absl::Time hedge_at = absl::Now() + hedge_->DelayFor(shard_->latency());
    if (hedge_->enabled && shard_->replicas().size() > 1 && hedge_at < deadline_) {
      scheduler_->Schedule(hedge_at, [weak] {
        if (auto self = weak.lock()) self->Hedge();
      });
    }
  }

 private:
  struct Attempt {
    Replica* replica;
    bool hedge;
    std::shared_ptr<const v1::SearchRequest> request;
    absl::Time start;
    grpc::ClientContext context;
    v1::SearchResponse response;
    bool cancelled_by_us = false;  // guarded by ShardCall::mu_
    bool in_flight = true;         // guarded by ShardCall::mu_
  };

  void Launch(Replica* replica, bool hedge, std::shared_ptr<const v1::SearchRequest> request) {
    auto attempt = std::make_shared<Attempt>();
    attempt->replica = replica;
    attempt->hedge = hedge;
    attempt->request = std::move(request);
    attempt->start = absl::Now();
    if (deadline_ != absl::InfiniteFuture()) {
      attempt->context.set_deadline(absl::ToChronoTime(deadline_));
    }
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      attempts_.push_back(attempt);
      tried_.push_back(replica);
    }
    replica->CallStarted();
    replica->stub()->async()->Search(&attempt->context, attempt->request.get(), &attempt->response,
                                     [self = shared_from_this(), attempt](grpc::Status status) {
                                       self->OnAttemptDone(attempt, std::move(status));
                                     });
    // A failover or hedge decided just before the caller cancelled: CancelAll ran without it.
    if (cancel_->cancelled()) CancelAll();
  }

  void Hedge() {
    Replica* replica = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || InFlight() != 1) return;
      replica = shard_->Pick(tried_);
    }
    if (replica == nullptr || !shard_->TakeHedge(hedge_->max_ratio)) return;
    shard_->metrics().hedges_sent->Increment();
    Launch(replica, /*hedge=*/true, request_.request);
  }

  int InFlight() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int n = 0;
    for (const auto& attempt : attempts_) n += attempt->in_flight;
    return n;
  }

  bool Transient(const grpc::Status& status, const Attempt& attempt) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancel_->cancelled()) return false;  // nobody waits for another replica's answer
    switch (status.error_code()) {
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::ABORTED:
        return true;
      case grpc::StatusCode::CANCELLED:
        return !attempt.cancelled_by_us;
      default:
        return false;
    }
  }

  // Whether `attempt` failed only because its replica does not know the request's subset
  // session, so that the request with groups will do.
  bool NeedsGroups(const grpc::Status& status, const Attempt& attempt) const {
    return request_.with_groups && attempt.request == request_.request &&
           status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
           IsUnknownSubsetSession(FromGrpcStatus(status));
  }

  // The request with its subset groups, built on first use.
  std::shared_ptr<const v1::SearchRequest> WithGroups() {
    absl::MutexLock lock(&mu_);
    if (with_groups_ == nullptr) with_groups_ = request_.with_groups();
    return with_groups_;
  }

  void OnAttemptDone(const std::shared_ptr<Attempt>& attempt, grpc::Status status) {
    const absl::Time now = absl::Now();
    Replica* failover = nullptr;
    bool resend_with_groups = false;
    absl::StatusOr<v1::SearchResponse> result;
    {
      absl::MutexLock lock(&mu_);
      attempt->in_flight = false;
      // A loser we cancelled took at least this long: its latency average must see that, or a
      // replica that never answers in time would stay the first choice.
      attempt->replica->CallFinished(now - attempt->start, status.ok() ? Replica::Latency::kExact
                                                           : attempt->cancelled_by_us
                                                               ? Replica::Latency::kLowerBound
                                                               : Replica::Latency::kNone);
      if (finished_) return;  // a loser
      if (NeedsGroups(status, *attempt)) {
        resend_with_groups = true;
      } else if (status.ok()) {
        result = std::move(attempt->response);
        if (attempt->hedge) shard_->metrics().hedges_won->Increment();
        shard_->latency().Add(now - start_);
      } else if (Transient(status, *attempt) && now < deadline_) {
        last_error_ = absl::StrCat(attempt->replica->address(), ": ", status.error_message());
        if (InFlight() > 0) return;  // another attempt may still answer
        failover = shard_->Pick(tried_);
        if (failover == nullptr) {
          result =
              absl::UnavailableError(absl::StrCat("no replica of shard ", shard_->shard_id(),
                                                  " answered (last error: ", last_error_, ")"));
        }
      } else {
        const absl::Status error = FromGrpcStatus(status);
        result = absl::Status(error.code(),
                              absl::StrCat(attempt->replica->address(), ": ", error.message()));
      }
      if (failover == nullptr && !resend_with_groups) finished_ = true;
    }
    if (resend_with_groups) {
      shard_->metrics().subset_resends->Increment();
      Launch(attempt->replica, attempt->hedge, WithGroups());
      return;
    }
    if (failover != nullptr) {
      shard_->metrics().failovers->Increment();
      Launch(failover, /*hedge=*/false, request_.request);
      return;
    }
    CancelAll();
    Finish(std::move(result));
  }

  void Finish(absl::StatusOr<v1::SearchResponse> result) {
    cancel_->Forget(cancel_id_);
    shard_->closing().Forget(closing_id_);
    const ShardMetrics& metrics = shard_->metrics();
    (result.ok() ? metrics.requests_ok : metrics.requests_failed)->Increment();
    metrics.latency->ObserveDuration(absl::Now() - start_);
    done_(std::move(result));
  }

  // Cancels every attempt still in flight (the caller gave up, or another attempt won).
  void CancelAll() {
    std::vector<std::shared_ptr<Attempt>> to_cancel;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& attempt : attempts_) {
        if (attempt->in_flight && !attempt->cancelled_by_us) {
          attempt->cancelled_by_us = true;
          to_cancel.push_back(attempt);
        }
      }
    }
    for (const auto& attempt : to_cancel) attempt->context.TryCancel();
  }

  ShardGroup* const shard_;
  const ShardRequest request_;
  const absl::Time deadline_;
  Scheduler* const scheduler_;
  const HedgeOptions* const hedge_;
  const ShardDone done_;
  const absl::Time start_;
  std::shared_ptr<CancelToken> cancel_;  // set by Start
  int64_t cancel_id_ = -1;
  int64_t closing_id_ = -1;

  absl::Mutex mu_;
  std::vector<std::shared_ptr<Attempt>> attempts_ ABSL_GUARDED_BY(mu_);
  std::vector<Replica*> tried_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const v1::SearchRequest> with_groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Duration HedgeOptions::DelayFor(const LatencyWindow& latency) const {
  if (delay > absl::ZeroDuration()) return delay;
  const std::optional<absl::Duration> observed = latency.Quantile(quantile, min_samples);
  return std::max(min_delay, observed.value_or(initial_delay));
}

void StartShardCall(ShardGroup* shard, ShardRequest request, absl::Time deadline,
                    const std::shared_ptr<CancelToken>& cancel, Scheduler* scheduler,
                    const HedgeOptions* hedge, ShardDone done) {
  auto call = std::make_shared<ShardCall>(shard, std::move(request), deadline, scheduler, hedge,
                                          std::move(done));
  call->Start(cancel);
}

}  // namespace knnserve
