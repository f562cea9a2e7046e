// The vocabulary shared by every index, the shard server, the router and the client: metrics,
// per-request search parameters and the neighbours a search returns.
#ifndef KNNSERVE_COMMON_SEARCH_TYPES_H_
#define KNNSERVE_COMMON_SEARCH_TYPES_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace knnserve {

enum class Metric {
  kL2,            // squared L2 distance; smaller is nearer
  kInnerProduct,  // inner product; larger is nearer
};

absl::string_view MetricName(Metric metric);

// The distance of a missing neighbour: the worst possible value in `metric`.
inline float WorstDistance(Metric metric) {
  return metric == Metric::kL2 ? std::numeric_limits<float>::infinity()
                               : -std::numeric_limits<float>::infinity();
}

// True when distance a (id_a) ranks strictly before distance b (id_b): nearer first, ties to the
// smaller id, missing neighbours (id < 0) last. A strict weak order, so results are
// deterministic whatever order the candidates arrive in.
inline bool RanksBefore(Metric metric, float a, int64_t id_a, float b, int64_t id_b) {
  if ((id_a < 0) != (id_b < 0)) return id_b < 0;
  if (a != b) return metric == Metric::kL2 ? a < b : a > b;
  return id_a < id_b;
}

// For each subset group, the datastore sentence ids it may match (distinct, in range).
using SubsetGroups = std::vector<std::vector<int64_t>>;

// `groups` shared, as search engines take them (SubsetSearcher::SearchSubset keeps what it
// packed for them while they are held).
inline std::shared_ptr<const SubsetGroups> ShareGroups(SubsetGroups groups) {
  return std::make_shared<const SubsetGroups>(std::move(groups));
}

// The sentence ids of all groups together.
inline int64_t TotalSentenceIds(const SubsetGroups& groups) {
  int64_t total = 0;
  for (const std::vector<int64_t>& group : groups) total += static_cast<int64_t>(group.size());
  return total;
}

// Per-call search parameters. Zero nprobe/ef_search means "the index's default".
struct SearchParams {
  int k = 16;
  int nprobe = 0;
  int ef_search = 0;
};

// rows x k neighbours, row-major, nearest first. Missing neighbours have id -1, value -1 and
// WorstDistance(metric). `values` is either empty (not resolved) or rows * k long.
struct Neighbors {
  int64_t rows = 0;
  int k = 0;
  std::vector<float> distances;
  std::vector<int64_t> ids;
  std::vector<int32_t> values;

  // rows x k of missing neighbours; with_values also sizes `values`.
  static Neighbors Missing(int64_t rows, int k, Metric metric, bool with_values);

  bool has_values() const { return !values.empty(); }
  const float* distance_row(int64_t r) const { return distances.data() + r * k; }
  const int64_t* id_row(int64_t r) const { return ids.data() + r * k; }
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_SEARCH_TYPES_H_
