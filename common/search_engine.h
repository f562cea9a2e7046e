// SearchEngine: what a shard serves and what the client's embedded mode runs in-process, the
// one engine behind both doors (DESIGN.md). An engine holds one slice of the datastore: a
// contiguous range of global token ids (with their values), and optionally the subset PQ codes
// of a contiguous range of sentences. The shard server adds only gRPC and process concerns;
// the router merges the Neighbors of several engines' answers.
#ifndef KNNSERVE_COMMON_SEARCH_ENGINE_H_
#define KNNSERVE_COMMON_SEARCH_ENGINE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/request.h"
#include "common/search_types.h"

namespace knnserve {

struct EngineInfo {
  int dim = 0;
  Metric metric = Metric::kL2;
  std::string factory;        // faiss index_factory string ("Flat", "OPQ64_256,IVF4096,PQ64")
  int64_t total_vectors = 0;  // in the whole datastore, all shards together
  int64_t id_begin = 0;       // this slice's global token ids: [id_begin, id_end)
  int64_t id_end = 0;
  int64_t num_sentences = 0;   // in the whole datastore; 0 when there are no subset codes
  int64_t sentence_begin = 0;  // sentences whose subset codes this slice holds
  int64_t sentence_end = 0;
  bool has_values = false;   // answers carry value tokens
  bool subset_only = false;  // full searches fail (IndexEngineOptions::full_search = false)

  IndexShape shape() const { return {dim, num_sentences}; }
};

struct EngineResult {
  Neighbors neighbors;           // ids are global; values filled when has_values
  int64_t vectors_searched = 0;  // for Coverage: vectors scanned or reachable by this search
};

// Thread-safety: Search is const and safe to call from many threads at once; an engine is an
// immutable snapshot once created.
class SearchEngine {
 public:
  virtual ~SearchEngine() = default;

  virtual const EngineInfo& info() const = 0;

  // Full search over this slice, or, when query.is_subset(), search restricted to the tokens of
  // each row's subset group (sentences outside [sentence_begin, sentence_end) are skipped: the
  // shard owning them answers for them).
  // REQUIRES: `query` came from ParseSearchRequest with info().shape().
  virtual absl::StatusOr<EngineResult> Search(const SearchQuery& query) const = 0;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_SEARCH_ENGINE_H_
