// Retriever: where kNN-MT's per-step neighbour search goes. Two implementations: the router over
// gRPC (remote_retriever.h) and an index directory loaded in-process (local_retriever.h, the
// embedded mode). Both run the same SearchEngine in the end, so they return the same neighbours.
//
// A decoding batch opens one RetrievalSession: the subset groups (subset kNN-MT) are declared
// once when it starts, then every decoding step is one Search call with the query rows of all
// live hypotheses of the batch.
#ifndef KNNSERVE_CLIENT_KNN_RETRIEVER_H_
#define KNNSERVE_CLIENT_KNN_RETRIEVER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/matrix.h"
#include "common/request.h"
#include "common/search_types.h"

namespace knnserve::knn {

// What a retriever searches: one datastore (all shards together).
struct RetrieverInfo {
  int dim = 0;
  Metric metric = Metric::kL2;
  int64_t total_vectors = 0;
  int64_t num_sentences = 0;     // 0 when the datastore has no sentence structure
  bool supports_subset = false;  // subset PQ codes present: sessions may declare groups
  bool subset_only = false;      // full searches fail: sessions must declare groups
  // Query rows one Search call accepts (a server's Info limits; the embedded mode enforces the
  // same defaults). The kNN processor sends larger steps in pieces.
  int64_t max_rows = RequestLimits().max_rows;
};

// One decoding batch's retrieval. Thread-compatible: one thread at a time (the decoder's).
class RetrievalSession {
 public:
  virtual ~RetrievalSession() = default;

  // One decoding step. queries: rows x info().dim (rows <= info().max_rows), finite. row_group:
  // empty for a full search, else rows entries, each an index into the groups the session was
  // started with. Returns rows x params.k neighbours nearest first, with values (target tokens);
  // missing neighbours have id -1, value -1.
  virtual absl::StatusOr<Neighbors> Search(MatrixView<const float> queries,
                                           const std::vector<int32_t>& row_group,
                                           const SearchParams& params) = 0;
};

// Thread-safety: StartSession may be called from several threads; each session is used by one.
class Retriever {
 public:
  virtual ~Retriever() = default;

  virtual const RetrieverInfo& info() const = 0;

  // Starts a session. `groups` empty: full search at every step. Otherwise the sentence ids
  // (datastore sentence numbers) each group may match; REQUIRES info().supports_subset.
  virtual absl::StatusOr<std::unique_ptr<RetrievalSession>> StartSession(SubsetGroups groups) = 0;
};

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_RETRIEVER_H_
