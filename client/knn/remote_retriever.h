// RemoteRetriever: kNN-MT retrieval through a knnserve router (or a single shard server: both
// serve the same Retrieval service). Each RetrievalSession is ONE SearchStream: the subset
// groups go out once in the SessionSetup message, then every decoding step is one step message
// answered by one response, in order.
//
// Failures: a step that takes longer than step_deadline cancels the stream; a broken stream
// (UNAVAILABLE, cancelled by the step deadline, router restart) is reopened, the setup re-sent
// and the step retried, up to max_retries times with doubling backoff (up to
// max_retry_backoff): the defaults wait 5.1 s in all, time for a restarted router to come back.
// A step answered with a
// non-transient error (INVALID_ARGUMENT, FAILED_PRECONDITION, ...) fails at once, naming it.
#ifndef KNNSERVE_CLIENT_KNN_REMOTE_RETRIEVER_H_
#define KNNSERVE_CLIENT_KNN_REMOTE_RETRIEVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/knn/retriever.h"
#include "knnserve/v1/retrieval.grpc.pb.h"
#include "shard/rpc_server.h"

namespace knnserve::knn {

struct RemoteRetrieverOptions {
  std::string address;          // host:port of the router
  TlsFiles tls;                 // client side: ca verifies the server; cert/key for mTLS
  std::string tls_server_name;  // name the server certificate must carry ("" = the host)
  absl::Duration connect_timeout = absl::Seconds(30);  // first Info call
  absl::Duration step_deadline = absl::Seconds(10);    // one decoding step, retries excluded
  int max_retries = 6;
  absl::Duration retry_backoff = absl::Milliseconds(100);  // doubled after each retry
  absl::Duration max_retry_backoff = absl::Seconds(2);
  bool allow_partial = false;  // accept answers that miss shards (Coverage says what)
  bool fp16_queries = false;   // send queries as fp16 (half the bytes, rounded features)
};

// Thread-safe: sessions are independent streams on one channel.
class RemoteRetriever : public Retriever {
 public:
  // Connects and asks the server for its Info (dims, metric, sizes, limits).
  static absl::StatusOr<std::unique_ptr<RemoteRetriever>> Create(
      const RemoteRetrieverOptions& options);

  const RetrieverInfo& info() const override { return info_; }
  absl::StatusOr<std::unique_ptr<RetrievalSession>> StartSession(SubsetGroups groups) override;

 private:
  RemoteRetriever(RemoteRetrieverOptions options, std::unique_ptr<v1::Retrieval::Stub> stub,
                  RetrieverInfo info);

  const RemoteRetrieverOptions options_;
  const std::unique_ptr<v1::Retrieval::Stub> stub_;
  const RetrieverInfo info_;
};

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_REMOTE_RETRIEVER_H_
