// The v1 Retrieval gRPC service over a SearchBackend, shared by knnserve-shard and
// knnserve-router (a router is a shard of shards). It only translates: validation at the edge
// (ParseSearchRequest), stream sessions (setup once, then steps answered in order, a bad step
// answered with error_code/error_message without ending the stream; a setup's groups get a
// new subset_session token that the steps' queries carry), subset groups kept under the
// requests' subset_session tokens (SubsetSessions), cancellation and deadlines handed to the
// backend, and per-method metrics.
#ifndef KNNSERVE_SHARD_RETRIEVAL_SERVICE_H_
#define KNNSERVE_SHARD_RETRIEVAL_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/request.h"
#include "knnserve/v1/retrieval.grpc.pb.h"
#include "shard/idle_streams.h"
#include "shard/metrics.h"
#include "shard/search_backend.h"

namespace knnserve {

struct ServiceMetrics {
  Counter* requests_ok;
  Counter* requests_failed;
  Histogram* latency;
  Gauge* in_flight;

  static ServiceMetrics For(MetricsRegistry* registry, const std::string& method);
};

// Bytes that calls hold while they last, bounded: new calls are refused beyond the bound.
// `held_gauge` (borrowed) shows the bytes held. Thread-safe.
class ByteBudget {
 public:
  ByteBudget(int64_t max_bytes, Gauge* held_gauge)
      : max_bytes_(max_bytes), held_gauge_(held_gauge) {}
  // Takes `bytes`; false (nothing taken) when they would exceed the budget while other calls
  // hold bytes (a lone call is always admitted, however large).
  bool TryTake(int64_t bytes);
  void Give(int64_t bytes);
  int64_t held() const;
  int64_t max_bytes() const { return max_bytes_; }

 private:
  const int64_t max_bytes_;
  Gauge* const held_gauge_;
  mutable absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

struct RetrievalServiceOptions {
  // Bounds the sentence ids kept under subset_session tokens.
  int64_t subset_session_sentences = SubsetSessions::kDefaultMaxSentences;
  // Bytes of answers admitted and not yet delivered (AnswerBytes of each call from its
  // admission until its answer was written, or the call ended): a client that does not read
  // its answers (HTTP/2 flow control) keeps them in the server's memory.
  int64_t max_undelivered_answer_bytes = int64_t{1} << 30;
  // Bytes of the subset groups that open streams declared at setup (8 per sentence id), held
  // for each stream's life.
  int64_t max_stream_group_bytes = int64_t{256} << 20;
  // A stream whose client sends nothing for this long is ended UNAVAILABLE (IdleStreams);
  // zero: never.
  absl::Duration stream_idle_timeout = absl::Minutes(5);
};

// Thread-safe; `backend` and `metrics` must outlive the service and its calls.
class RetrievalService final : public v1::Retrieval::CallbackService {
 public:
  RetrievalService(SearchBackend* backend, RequestLimits limits, MetricsRegistry* metrics,
                   RetrievalServiceOptions options = {});

  grpc::ServerUnaryReactor* Search(grpc::CallbackServerContext* context,
                                   const v1::SearchRequest* request,
                                   v1::SearchResponse* response) override;
  grpc::ServerBidiReactor<v1::StreamRequest, v1::SearchResponse>* SearchStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const v1::InfoRequest* request,
                                 v1::InfoResponse* response) override;

 private:
  friend class StreamReactor;
  // Takes `bytes` from `budget`; UNAVAILABLE (kShardOverloaded, naming `what` and `flag`) when
  // it is spent.
  absl::Status Admit(ByteBudget& budget, int64_t bytes, absl::string_view what,
                     absl::string_view flag);

  // ParseSearchRequest against the backend's shape and the kept subset sessions, counting
  // what the request did with its subset_session token.
  absl::StatusOr<SearchQuery> Parse(const v1::SearchRequest& request,
                                    std::shared_ptr<const SubsetGroups> stream_groups,
                                    const std::string& stream_session);

  SearchBackend* const backend_;
  const RequestLimits limits_;
  const ServiceMetrics search_metrics_;
  const ServiceMetrics step_metrics_;
  const ServiceMetrics info_metrics_;
  SubsetSessions subset_sessions_;
  ByteBudget answers_;
  ByteBudget stream_groups_;
  IdleStreams idle_streams_;
  MetricsRegistry* const metrics_;  // refusals are counted by reason
  // Requests whose subset_session token came with groups (kept), took kept groups, or named
  // a token this server does not hold.
  Counter* const sessions_declared_;
  Counter* const sessions_reused_;
  Counter* const sessions_unknown_;
};

// Fills the result part of `response` from an answer (or its error, for stream steps).
void FillResponse(const SearchAnswer& answer, v1::SearchResponse* response);

}  // namespace knnserve

#endif  // KNNSERVE_SHARD_RETRIEVAL_SERVICE_H_
