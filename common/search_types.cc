#include "common/search_types.h"

namespace knnserve {

absl::string_view MetricName(Metric metric) {
  switch (metric) {
    case Metric::kL2:
      return "L2";
    case Metric::kInnerProduct:
      return "inner_product";
  }
  return "unknown";
}

Neighbors Neighbors::Missing(int64_t rows, int k, Metric metric, bool with_values) {
  Neighbors n;
  n.rows = rows;
  n.k = k;
  n.distances.assign(rows * k, WorstDistance(metric));
  n.ids.assign(rows * k, -1);
  if (with_values) n.values.assign(rows * k, -1);
  return n;
}

}  // namespace knnserve
