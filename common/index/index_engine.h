// IndexEngine: the SearchEngine (common/search_engine.h) over an index directory written by
// BuildIndex: one shard (what a shard server serves) or all shards merged in-process (the
// client's embedded mode). Full searches go to the shard's faiss index; subset searches
// (query.is_subset()) to the subset ADC engine over the shard's PQ codes. Every file is checked
// against the manifest's size and SHA-256 before use; a mismatch fails with DATA_LOSS naming
// the file.
#ifndef KNNSERVE_COMMON_INDEX_INDEX_ENGINE_H_
#define KNNSERVE_COMMON_INDEX_INDEX_ENGINE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/adc/adc_kernels.h"
#include "common/search_engine.h"

namespace knnserve {

class SubsetAdc;
class SubsetSearcher;

struct IndexEngineOptions {
  int threads = 1;  // OpenMP threads per search (faiss and subset ADC)
  AdcKernel adc_kernel = BestAdcKernel();
  // CreateLocalEngine: shards whose IVF-PQ lists IvfAdc scans become one engine (one coarse
  // search and one table per query and list for all of them; identical answers).
  bool merge_shards = true;
  // False: the engine answers subset searches only and never reads the shards' faiss index files
  // (an IVF-PQ shard's lists, ids and serving form are its largest part after the subset codes,
  // and subset kNN-MT never searches them); full searches fail with FAILED_PRECONDITION.
  // REQUIRES (else FAILED_PRECONDITION at creation): the index has subset codes.
  bool full_search = true;
  // When set, each engine's subset ADC (the CPU engine over its shard's codes) is handed to this
  // function and searched through what it returns, e.g. a CudaSubsetAdc holding the codes on a
  // GPU (common/adc/cuda; shard/main.cc's --subset-device). Left unset: the CPU engine.
  std::function<absl::StatusOr<std::unique_ptr<const SubsetSearcher>>(
      std::shared_ptr<const SubsetAdc>)>
      subset_searcher;
};

// The engine of shard `shard_id` of the index in `dir`.
absl::StatusOr<std::unique_ptr<SearchEngine>> CreateEngine(const std::string& dir, int shard_id,
                                                           const IndexEngineOptions& options);

// All shards of the index in `dir` in one engine: each search runs on every shard and the
// results are merged with MergeTopK (equal to one unsharded index, exactly for Flat), or, for
// IVF-PQ shards scanned by IvfAdc (options.merge_shards), on their lists merged into one.
absl::StatusOr<std::unique_ptr<SearchEngine>> CreateLocalEngine(const std::string& dir,
                                                                const IndexEngineOptions& options);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_INDEX_INDEX_ENGINE_H_
