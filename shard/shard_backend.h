// The shard side of the Retrieval service: one SearchEngine behind a Batcher. It starts empty
// (requests get UNAVAILABLE "loading") so that the server can listen and report NOT_SERVING
// while the index loads; SetEngine installs the engine after a warm-up query.
#ifndef KNNSERVE_SHARD_SHARD_BACKEND_H_
#define KNNSERVE_SHARD_SHARD_BACKEND_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/search_engine.h"
#include "shard/batcher.h"
#include "shard/metrics.h"
#include "shard/search_backend.h"

namespace knnserve {

// Thread-safe.
class ShardBackend : public SearchBackend {
 public:
  // `metrics` must outlive the backend.
  ShardBackend(int32_t shard_id, BatcherOptions options, MetricsRegistry* metrics);
  ~ShardBackend() override;

  // Runs a warm-up query on `engine` and, when it succeeds, starts serving it. At most once.
  absl::Status SetEngine(std::unique_ptr<SearchEngine> engine);

  absl::StatusOr<IndexShape> Shape() const override;
  absl::StatusOr<v1::InfoResponse> Info() const override;
  void Search(SearchCall call, SearchDone done) override;

 private:
  struct Serving {
    std::unique_ptr<SearchEngine> engine;
    std::unique_ptr<Batcher> batcher;
  };
  std::shared_ptr<const Serving> serving() const;

  const int32_t shard_id_;
  const BatcherOptions options_;
  MetricsRegistry* const metrics_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Serving> serving_ ABSL_GUARDED_BY(mu_);
};

// The warm-up query: one zero row, k = 1, over the whole slice; for a subset-only slice, over the
// slice's first sentence.
SearchQuery WarmUpQuery(const EngineInfo& info);

}  // namespace knnserve

#endif  // KNNSERVE_SHARD_SHARD_BACKEND_H_
