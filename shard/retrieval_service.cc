#include "shard/retrieval_service.h"

#include <atomic>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/wire.h"

namespace knnserve {
namespace {

absl::Time DeadlineOf(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// Counts one call in flight and records its outcome and latency once.
class CallMetrics {
 public:
  explicit CallMetrics(const ServiceMetrics& metrics) : metrics_(metrics), start_(absl::Now()) {
    metrics_.in_flight->Add(1);
  }
  void Done(bool ok) {
    (ok ? metrics_.requests_ok : metrics_.requests_failed)->Increment();
    metrics_.latency->ObserveDuration(absl::Now() - start_);
    metrics_.in_flight->Add(-1);
  }

 private:
  const ServiceMetrics& metrics_;
  const absl::Time start_;
};

// A unary call whose cancellation reaches the backend. The answer bytes it holds (Hold) go
// back to the budget when the call is over: its answer delivered, or the call gone.
class UnaryReactor : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(const ServiceMetrics& metrics, std::shared_ptr<CancelToken> cancel)
      : metrics_(metrics), cancel_(std::move(cancel)) {}

  void Hold(ByteBudget* budget, int64_t bytes) {
    budget_ = budget;
    held_bytes_ = bytes;
  }
  void Complete(const absl::Status& status) {
    metrics_.Done(status.ok());
    Finish(ToGrpcStatus(status));
  }
  void OnCancel() override { cancel_->Cancel(); }
  void OnDone() override {
    if (budget_ != nullptr) budget_->Give(held_bytes_);
    delete this;
  }

 private:
  CallMetrics metrics_;
  const std::shared_ptr<CancelToken> cancel_;
  ByteBudget* budget_ = nullptr;
  int64_t held_bytes_ = 0;
};

// What ByteBudget refusals name: their reason (a metric label) and the flag that sets the bound.
constexpr absl::string_view kUndelivered = "undelivered_answers";
constexpr absl::string_view kUndeliveredFlag = "--max-undelivered-mib";
constexpr absl::string_view kStreamGroups = "stream_subset_groups";
constexpr absl::string_view kStreamGroupsFlag = "--max-stream-groups-mib";

Counter* SubsetSessionCounter(MetricsRegistry* registry, const std::string& event) {
  return registry->GetCounter(
      "knnserve_subset_session_requests_total",
      "Requests naming a subset_session: with groups (declared), using kept groups (reused), "
      "or naming one this server does not hold (unknown)",
      {{"event", event}});
}

}  // namespace

ServiceMetrics ServiceMetrics::For(MetricsRegistry* registry, const std::string& method) {
  return {
      registry->GetCounter("knnserve_requests_total", "Requests answered, by method and result",
                           {{"method", method}, {"result", "ok"}}),
      registry->GetCounter("knnserve_requests_total", "Requests answered, by method and result",
                           {{"method", method}, {"result", "error"}}),
      registry->GetHistogram("knnserve_request_seconds", "Request latency by method",
                             {{"method", method}}, Histogram::LatencyBounds()),
      registry->GetGauge("knnserve_requests_in_flight", "Requests in flight by method",
                         {{"method", method}}),
  };
}

void FillResponse(const SearchAnswer& answer, v1::SearchResponse* response) {
  EncodeNeighbors(answer.neighbors, response);
  *response->mutable_coverage() = answer.coverage;
}

bool ByteBudget::TryTake(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (held_ > 0 && held_ + bytes > max_bytes_) return false;
  held_ += bytes;
  held_gauge_->Set(held_);
  return true;
}

void ByteBudget::Give(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  held_ -= bytes;
  held_gauge_->Set(held_);
}

int64_t ByteBudget::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

RetrievalService::RetrievalService(SearchBackend* backend, RequestLimits limits,
                                   MetricsRegistry* metrics, RetrievalServiceOptions options)
    : backend_(backend),
      limits_(limits),
      search_metrics_(ServiceMetrics::For(metrics, "Search")),
      step_metrics_(ServiceMetrics::For(metrics, "SearchStream.step")),
      info_metrics_(ServiceMetrics::For(metrics, "Info")),
      subset_sessions_(options.subset_session_sentences),
      answers_(options.max_undelivered_answer_bytes,
               metrics->GetGauge("knnserve_undelivered_answer_bytes",
                                 "Bytes of answers admitted and not yet delivered", {})),
      stream_groups_(options.max_stream_group_bytes,
                     metrics->GetGauge("knnserve_stream_group_bytes",
                                       "Bytes of subset groups held by open streams", {})),
      idle_streams_(options.stream_idle_timeout,
                    metrics->GetCounter("knnserve_idle_streams_ended_total",
                                        "Streams ended after --stream-idle-seconds without a "
                                        "message from their client",
                                        {})),
      metrics_(metrics),
      sessions_declared_(SubsetSessionCounter(metrics, "declared")),
      sessions_reused_(SubsetSessionCounter(metrics, "reused")),
      sessions_unknown_(SubsetSessionCounter(metrics, "unknown")) {}

absl::Status RetrievalService::Admit(ByteBudget& budget, int64_t bytes, absl::string_view what,
                                     absl::string_view flag) {
  if (budget.TryTake(bytes)) return absl::OkStatus();
  metrics_
      ->GetCounter("knnserve_refused_total", "Valid requests refused before searching, by reason",
                   {{"reason", std::string(what)}})
      ->Increment();
  return absl::UnavailableError(absl::StrCat(kShardOverloaded, ": ", budget.held() >> 20,
                                             " MiB of ", absl::StrReplaceAll(what, {{"_", " "}}),
                                             " held (at most ", budget.max_bytes() >> 20, " MiB; ",
                                             flag, ")"));
}

absl::StatusOr<SearchQuery> RetrievalService::Parse(
    const v1::SearchRequest& request, std::shared_ptr<const SubsetGroups> stream_groups,
    const std::string& stream_session) {
  ASSIGN_OR_RETURN(IndexShape shape, backend_->Shape());
  absl::StatusOr<SearchQuery> query = ParseSearchRequest(
      request, shape, limits_, {std::move(stream_groups), stream_session, &subset_sessions_},
      backend_->query_form());
  if (!request.subset_session().empty()) {
    if (!query.ok()) {
      if (IsUnknownSubsetSession(query.status())) sessions_unknown_->Increment();
    } else {
      (request.subset_groups_size() > 0 ? sessions_declared_ : sessions_reused_)->Increment();
    }
  }
  return query;
}

grpc::ServerUnaryReactor* RetrievalService::Search(grpc::CallbackServerContext* context,
                                                   const v1::SearchRequest* request,
                                                   v1::SearchResponse* response) {
  SearchCall call;
  call.deadline = DeadlineOf(context);
  auto* reactor = new UnaryReactor(search_metrics_, call.cancel);
  response->set_request_id(request->request_id());
  absl::StatusOr<SearchQuery> query = Parse(*request, nullptr, "");
  if (!query.ok()) {
    reactor->Complete(query.status());
    return reactor;
  }
  const int64_t answer_bytes = AnswerBytes(*query);
  if (absl::Status admitted = Admit(answers_, answer_bytes, kUndelivered, kUndeliveredFlag);
      !admitted.ok()) {
    reactor->Complete(admitted);
    return reactor;
  }
  reactor->Hold(&answers_, answer_bytes);
  call.query = *std::move(query);
  backend_->Search(std::move(call), [reactor, response](absl::StatusOr<SearchAnswer> answer) {
    if (answer.ok()) FillResponse(*answer, response);
    reactor->Complete(answer.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* RetrievalService::Info(grpc::CallbackServerContext* context,
                                                 const v1::InfoRequest* /*request*/,
                                                 v1::InfoResponse* response) {
  auto* reactor = new UnaryReactor(info_metrics_, std::make_shared<CancelToken>());
  absl::StatusOr<v1::InfoResponse> info = backend_->Info();
  if (info.ok()) {
    *response = *std::move(info);
    // A router's backend reports its shards' limits: it advertises what both take.
    v1::Limits limits;
    limits_.ToProto(response->dim(), &limits);
    if (response->has_limits()) NarrowLimits(response->limits(), &limits);
    *response->mutable_limits() = std::move(limits);
  }
  reactor->Complete(info.status());
  return reactor;
}

// One decoding session. At most one operation is outstanding at a time (a read, a search or a
// write), so steps are answered in order. Two things run concurrently with them: OnCancel,
// which touches the thread-safe CancelToken alone, and the idle sweeper (EndIfIdleSince),
// which may end the stream while it waits for a read; mu_ orders the reads and Finish
// against it.
class StreamReactor : public grpc::ServerBidiReactor<v1::StreamRequest, v1::SearchResponse>,
                      public IdleStreams::Stream {
 public:
  StreamReactor(RetrievalService* service, grpc::CallbackServerContext* context)
      : service_(service), deadline_(DeadlineOf(context)) {
    service_->idle_streams_.Add(this);
    StartNextRead();
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      waiting_ = false;
      if (finished_) return;  // ended as idle while the read was pending: nothing more to do
    }
    if (!ok) {  // the client closed its side (or the call is gone): the session is over
      FinishOnce(grpc::Status::OK);
      return;
    }
    if (request_.has_setup()) {
      absl::Status status = Setup(request_.setup());
      if (!status.ok()) {
        FinishOnce(ToGrpcStatus(status));
        return;
      }
      StartNextRead();
      return;
    }
    steps_started_ = true;
    Step();
  }

  void OnWriteDone(bool ok) override {
    ReleaseAnswer();
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed"));
      return;
    }
    StartNextRead();
  }

  void OnCancel() override { cancel_->Cancel(); }
  void OnDone() override {
    ReleaseAnswer();  // a step whose write never completed
    service_->stream_groups_.Give(held_group_bytes_);
    service_->idle_streams_.Remove(this);
    Unref();
  }

  bool EndIfIdleSince(std::chrono::steady_clock::time_point cutoff,
                      const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (finished_ || !waiting_ || waiting_since_ >= cutoff) return false;
    finished_ = true;
    Finish(status);
    return true;
  }
  void Ref() override { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() override {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 private:
  // Waits for the client's next message, unless the stream has ended; the idle clock runs
  // from here.
  void StartNextRead() {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    waiting_ = true;
    waiting_since_ = std::chrono::steady_clock::now();
    StartRead(&request_);
  }

  void FinishOnce(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    Finish(std::move(status));
  }

  void ReleaseAnswer() {
    service_->answers_.Give(held_bytes_);
    held_bytes_ = 0;
  }

  absl::Status Setup(const v1::SessionSetup& setup) {
    if (setup_seen_ || steps_started_) {
      return absl::InvalidArgumentError("setup: at most one setup message, before the first step");
    }
    setup_seen_ = true;
    ASSIGN_OR_RETURN(IndexShape shape, service_->backend_->Shape());
    if (setup.default_params().k() != 0) {
      RETURN_IF_ERROR(ValidateParams(setup.default_params(), service_->limits_));
    }
    if (setup.subset_groups_size() > 0) {
      ASSIGN_OR_RETURN(SubsetGroups groups,
                       ParseSubsetGroups(setup.subset_groups(), shape, service_->limits_));
      const int64_t bytes = TotalSentenceIds(groups) * static_cast<int64_t>(sizeof(int64_t));
      RETURN_IF_ERROR(
          service_->Admit(service_->stream_groups_, bytes, kStreamGroups, kStreamGroupsFlag));
      held_group_bytes_ = bytes;
      session_groups_ = std::make_shared<const SubsetGroups>(std::move(groups));
      session_token_ = NewSubsetSession();
    }
    default_params_ = setup.default_params();
    allow_partial_ = setup.allow_partial();
    return absl::OkStatus();
  }

  absl::StatusOr<SearchQuery> ParseStep(v1::SearchRequest* step) const {
    if (step->params().k() == 0 && default_params_.k() != 0) {
      *step->mutable_params() = default_params_;
    }
    if (step->row_group_size() > 0 && step->subset_groups_size() == 0 &&
        step->subset_session().empty() && session_groups_ == nullptr) {
      return absl::FailedPreconditionError(
          "step: row_group refers to subset groups, but no setup message declared any");
    }
    ASSIGN_OR_RETURN(SearchQuery query, service_->Parse(*step, session_groups_, session_token_));
    query.allow_partial = query.allow_partial || allow_partial_;
    return query;
  }

  void Step() {
    auto metrics = std::make_shared<CallMetrics>(service_->step_metrics_);
    response_.Clear();
    response_.set_request_id(request_.step().request_id());
    absl::StatusOr<SearchQuery> query = ParseStep(request_.mutable_step());
    if (!query.ok()) {
      Answer(query.status(), *metrics);
      return;
    }
    const int64_t answer_bytes = AnswerBytes(*query);
    if (absl::Status admitted =
            service_->Admit(service_->answers_, answer_bytes, kUndelivered, kUndeliveredFlag);
        !admitted.ok()) {
      Answer(admitted, *metrics);
      return;
    }
    held_bytes_ = answer_bytes;
    SearchCall call{*std::move(query), deadline_, cancel_};
    service_->backend_->Search(std::move(call),
                               [this, metrics](absl::StatusOr<SearchAnswer> answer) {
                                 if (answer.ok()) FillResponse(*answer, &response_);
                                 Answer(answer.status(), *metrics);
                               });
  }

  void Answer(const absl::Status& status, CallMetrics& metrics) {
    metrics.Done(status.ok());
    if (!status.ok()) {
      response_.set_error_code(static_cast<int>(ToGrpcStatus(status).error_code()));
      response_.set_error_message(std::string(status.message()));
    }
    StartWrite(&response_);
  }

  RetrievalService* const service_;
  const absl::Time deadline_;
  const std::shared_ptr<CancelToken> cancel_ = std::make_shared<CancelToken>();
  v1::StreamRequest request_;
  v1::SearchResponse response_;
  bool setup_seen_ = false;
  bool steps_started_ = false;
  std::shared_ptr<const SubsetGroups> session_groups_;
  std::string session_token_;  // names session_groups_ to the backend's shards
  v1::SearchParams default_params_;
  bool allow_partial_ = false;
  int64_t held_bytes_ = 0;        // of service_->answers_, for the step being answered
  int64_t held_group_bytes_ = 0;  // of service_->stream_groups_, for session_groups_
  // gRPC's reference until OnDone, and the idle sweeper's while it looks at the stream.
  std::atomic<int> refs_{1};
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish called: no more reads
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;   // a read is outstanding
  std::chrono::steady_clock::time_point waiting_since_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerBidiReactor<v1::StreamRequest, v1::SearchResponse>* RetrievalService::SearchStream(
    grpc::CallbackServerContext* context) {
  return new StreamReactor(this, context);
}

}  // namespace knnserve
