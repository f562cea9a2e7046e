#include "common/topk.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace knnserve {
namespace {

absl::Status CheckPart(const Neighbors& part, size_t index, int64_t rows) {
  const size_t size = static_cast<size_t>(part.rows) * part.k;
  if (part.rows != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("MergeTopK: part ", index, " has ", part.rows, " rows, part 0 has ", rows));
  }
  if (part.k < 0 || part.distances.size() != size || part.ids.size() != size ||
      (part.has_values() && part.values.size() != size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MergeTopK: part ", index, " arrays do not match rows x k = ", part.rows, " x ", part.k));
  }
  return absl::OkStatus();
}

// Cursor into one part's current row.
struct Head {
  const Neighbors* part;
  int64_t offset;  // index of the candidate in part->distances
  int64_t end;     // end of the row
};

}  // namespace

absl::StatusOr<Neighbors> MergeTopK(absl::Span<const Neighbors* const> parts, int k,
                                    Metric metric) {
  if (k < 0) return absl::InvalidArgumentError(absl::StrCat("MergeTopK: k = ", k));
  const int64_t rows = parts.empty() ? 0 : parts[0]->rows;
  bool with_values = !parts.empty();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (absl::Status s = CheckPart(*parts[i], i, rows); !s.ok()) return s;
    with_values = with_values && parts[i]->has_values();
  }
  Neighbors out = Neighbors::Missing(rows, k, metric, with_values);

  // A min-heap of part heads ordered by their current candidate. With S parts (shards) and k
  // outputs a row costs O(k log S), and no part row is read past what the output needs.
  auto worse = [metric](const Head& a, const Head& b) {
    return RanksBefore(metric, b.part->distances[b.offset], b.part->ids[b.offset],
                       a.part->distances[a.offset], a.part->ids[a.offset]);
  };
  std::vector<Head> heap;
  heap.reserve(parts.size());
  for (int64_t r = 0; r < rows; ++r) {
    heap.clear();
    for (const Neighbors* part : parts) {
      const int64_t begin = r * part->k;
      if (part->k > 0 && part->ids[begin] >= 0) heap.push_back({part, begin, begin + part->k});
    }
    std::make_heap(heap.begin(), heap.end(), worse);
    for (int j = 0; j < k && !heap.empty(); ++j) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      Head& best = heap.back();
      const int64_t o = r * k + j;
      out.distances[o] = best.part->distances[best.offset];
      out.ids[o] = best.part->ids[best.offset];
      if (with_values) out.values[o] = best.part->values[best.offset];
      if (++best.offset < best.end && best.part->ids[best.offset] >= 0) {
        std::push_heap(heap.begin(), heap.end(), worse);
      } else {
        heap.pop_back();
      }
    }
  }
  return out;
}

bool IsMergedTopK(const Neighbors& part, int k, Metric metric) {
  if (part.k != k || !CheckPart(part, 0, part.rows).ok()) return false;
  const float worst = WorstDistance(metric);
  for (int64_t r = 0; r < part.rows; ++r) {
    const int64_t end = (r + 1) * k;
    int64_t i = r * k;
    while (i < end && part.ids[i] >= 0) ++i;
    for (; i < end; ++i) {
      if (part.ids[i] != -1 || std::memcmp(&part.distances[i], &worst, sizeof(worst)) != 0 ||
          (part.has_values() && part.values[i] != -1)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace knnserve
