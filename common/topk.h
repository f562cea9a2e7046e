// Merging per-shard top-k lists into one global top-k.
#ifndef KNNSERVE_COMMON_TOPK_H_
#define KNNSERVE_COMMON_TOPK_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/search_types.h"

namespace knnserve {

// k-way merge of sorted neighbour lists, row by row: row r of the result is the k best of the
// union of row r of every part, in RanksBefore order (nearest first, ties to the smaller id,
// missing last). Parts may have different k; values are carried when every part has them.
//
// REQUIRES: each part's rows are sorted in RanksBefore order (as every search returns them).
// Returns INVALID_ARGUMENT when parts disagree on the row count or are inconsistently sized.
absl::StatusOr<Neighbors> MergeTopK(absl::Span<const Neighbors* const> parts, int k, Metric metric);

// Whether MergeTopK({&part}, k, metric) returns `part` as it is (so that a merge of one part can
// be skipped): `part` is consistently sized with k columns, and in each row every entry from the
// first negative id on is a missing one as Neighbors::Missing makes it (id -1, the metric's
// worst distance, value -1 when there are values).
bool IsMergedTopK(const Neighbors& part, int k, Metric metric);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_TOPK_H_
