// What a Retrieval gRPC service serves: a shard (one engine behind a batcher) or a router (a
// fan-out over shards). RetrievalService translates between the protocol and this interface;
// everything else lives behind it in plain classes that tests drive without a network.
#ifndef KNNSERVE_SHARD_SEARCH_BACKEND_H_
#define KNNSERVE_SHARD_SEARCH_BACKEND_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/request.h"
#include "common/search_types.h"
#include "knnserve/v1/retrieval.pb.h"

namespace knnserve {

// Set when the caller gives up (the call was cancelled or its deadline passed); work that has
// not started yet is dropped and outstanding sub-calls are cancelled. Thread-safe.
class CancelToken {
 public:
  // Runs every registered callback once, on the calling thread.
  void Cancel();
  bool cancelled() const;
  // Runs `callback` at Cancel(), or right away when already cancelled. Returns an id for
  // Forget() (a long stream's token must not collect the callbacks of every finished step).
  int64_t OnCancel(std::function<void()> callback);
  // Drops the callback registered as `id` if it has not run.
  void Forget(int64_t id);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

struct SearchAnswer {
  Neighbors neighbors;
  v1::Coverage coverage;
};

struct SearchCall {
  SearchQuery query;
  absl::Time deadline = absl::InfiniteFuture();
  std::shared_ptr<CancelToken> cancel = std::make_shared<CancelToken>();
};

using SearchDone = std::function<void(absl::StatusOr<SearchAnswer>)>;

// Thread-safe.
class SearchBackend {
 public:
  virtual ~SearchBackend() = default;

  // The shape requests are validated against; UNAVAILABLE (naming why) while not ready.
  virtual absl::StatusOr<IndexShape> Shape() const = 0;
  // Info without limits (the service adds them); UNAVAILABLE while not ready.
  virtual absl::StatusOr<v1::InfoResponse> Info() const = 0;
  // The form Search wants the queries of its calls in (see SearchQuery::packed_queries).
  virtual QueryForm query_form() const { return QueryForm::kDecoded; }
  // Runs a validated query; `done` is called exactly once, on any thread, possibly before
  // Search returns.
  virtual void Search(SearchCall call, SearchDone done) = 0;
};

}  // namespace knnserve

#endif  // KNNSERVE_SHARD_SEARCH_BACKEND_H_
