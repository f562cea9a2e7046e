// SearchIndex: a k-nearest-neighbour index over dense float vectors with local ids
// 0..size()-1 (a shard adds its global id base). The faiss adapter (faiss_index.h) implements
// it for any faiss index_factory string.
#ifndef KNNSERVE_COMMON_INDEX_SEARCH_INDEX_H_
#define KNNSERVE_COMMON_INDEX_SEARCH_INDEX_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/files.h"
#include "common/matrix.h"
#include "common/search_types.h"

namespace knnserve {

// Thread-safety: const methods (Search, Save) are safe from many threads at once; Train and Add
// need exclusive access.
class SearchIndex {
 public:
  virtual ~SearchIndex() = default;

  virtual int dim() const = 0;
  virtual Metric metric() const = 0;
  // Number of vectors added so far.
  virtual int64_t size() const = 0;
  virtual bool is_trained() const = 0;

  // Learns quantizers/transforms from `sample` (rows x dim()). Call once, before Add.
  virtual absl::Status Train(MatrixView<const float> sample) = 0;
  // Appends `vectors` (rows x dim()); they get the local ids size() .. size() + rows - 1.
  virtual absl::Status Add(MatrixView<const float> vectors) = 0;

  // Searches `queries` (rows x dim(), finite; the caller validated them) and returns rows x
  // params.k neighbours with local ids, each row in RanksBefore order (nearest first, ties to
  // the smaller id, missing neighbours id -1 at the end). params.nprobe / params.ef_search of 0
  // keep the index's defaults; they are ignored by indexes without such a knob.
  virtual absl::StatusOr<Neighbors> Search(MatrixView<const float> queries,
                                           const SearchParams& params) const = 0;

  // Writes the index atomically (temp file, fsync, rename) and returns the file's digest.
  virtual absl::StatusOr<FileDigest> Save(const std::string& path) const = 0;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_INDEX_SEARCH_INDEX_H_
