// Test support: an exact brute-force SearchEngine over an in-memory datastore slice, and the
// datastore it searches (random keys, values, sentence offsets). Router tests compare sharded
// answers with one FlatEngine over everything: distances are computed identically per vector,
// so the answers must be equal exactly.
#ifndef KNNSERVE_TESTS_SERVER_FLAT_ENGINE_H_
#define KNNSERVE_TESTS_SERVER_FLAT_ENGINE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/matrix.h"
#include "common/search_engine.h"

namespace knnserve::testing {

struct Datastore {
  Metric metric = Metric::kL2;
  Matrix<float> keys;                     // one row per token
  std::vector<int32_t> values;            // one per token
  std::vector<int64_t> sentence_offsets;  // num_sentences + 1, tokens of sentence s:
                                          // [offsets[s], offsets[s + 1])
  int64_t num_sentences() const { return static_cast<int64_t>(sentence_offsets.size()) - 1; }
};

// `num_sentences` sentences of 1..max_length tokens with random keys (seeded).
std::shared_ptr<const Datastore> MakeDatastore(int64_t num_sentences, int dim, int max_length,
                                               uint32_t seed, Metric metric = Metric::kL2);

// Thread-safe (immutable).
class FlatEngine : public SearchEngine {
 public:
  // Serves sentences [sentence_begin, sentence_end) of `data` and their tokens.
  FlatEngine(std::shared_ptr<const Datastore> data, int64_t sentence_begin, int64_t sentence_end);

  const EngineInfo& info() const override { return info_; }
  absl::StatusOr<EngineResult> Search(const SearchQuery& query) const override;

 private:
  // The k best of tokens [begin, end) for one query row, appended in rank order.
  void SearchRow(const float* query, const std::vector<std::pair<int64_t, int64_t>>& ranges, int k,
                 Neighbors* out, int64_t row) const;

  const std::shared_ptr<const Datastore> data_;
  EngineInfo info_;
};

// Splits the datastore into `num_shards` engines of about equal sentence counts.
std::vector<std::unique_ptr<SearchEngine>> MakeShardEngines(
    const std::shared_ptr<const Datastore>& data, int num_shards);

}  // namespace knnserve::testing

#endif  // KNNSERVE_TESTS_SERVER_FLAT_ENGINE_H_
