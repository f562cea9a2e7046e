// LocalRetriever: the embedded mode. The index directory's shards are loaded in-process into one
// SearchEngine (common/index/index_engine.h CreateLocalEngine, the engine the shard servers run)
// and searched directly: no servers, no serialization beyond the request validation every
// server also does.
#ifndef KNNSERVE_CLIENT_KNN_LOCAL_RETRIEVER_H_
#define KNNSERVE_CLIENT_KNN_LOCAL_RETRIEVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/knn/retriever.h"
#include "common/request.h"
#include "common/search_engine.h"

namespace knnserve::knn {

// Thread-safe (the engine is immutable; sessions are independent).
class LocalRetriever : public Retriever {
 public:
  // Loads every shard of the index in `index_dir` (sizes and SHA-256 verified); searches run
  // with `threads` OpenMP threads. Without `full_search` only the subset codes are loaded
  // (IndexEngineOptions::full_search): subset sessions only, and no faiss index in memory.
  static absl::StatusOr<std::unique_ptr<LocalRetriever>> Create(const std::string& index_dir,
                                                                int threads,
                                                                bool full_search = true);
  // Over an engine that holds the whole datastore (id range [0, total_vectors), values).
  static absl::StatusOr<std::unique_ptr<LocalRetriever>> Create(
      std::unique_ptr<SearchEngine> engine);

  const RetrieverInfo& info() const override { return info_; }
  absl::StatusOr<std::unique_ptr<RetrievalSession>> StartSession(SubsetGroups groups) override;

 private:
  LocalRetriever(std::unique_ptr<SearchEngine> engine, RetrieverInfo info);

  const std::unique_ptr<SearchEngine> engine_;
  const RetrieverInfo info_;
  const RequestLimits limits_;
};

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_LOCAL_RETRIEVER_H_
