#include "common/datastore/batch_plan.h"

#include <algorithm>

#include "common/check.h"

namespace knnserve {

std::vector<Batch> PlanBatches(absl::Span<const int64_t> lengths, int64_t max_tokens,
                               int64_t max_sentences) {
  KNNSERVE_CHECK(max_tokens > 0 && max_sentences > 0, "batch limits must be positive");
  std::vector<Batch> batches;
  const int64_t n = static_cast<int64_t>(lengths.size());
  int64_t i = 0;
  while (i < n) {
    Batch batch{i, i + 1, lengths[i]};
    while (batch.end < n && batch.end - batch.begin < max_sentences) {
      const int64_t longest = std::max(batch.max_length, lengths[batch.end]);
      if ((batch.end - batch.begin + 1) * longest > max_tokens) break;
      batch.max_length = longest;
      ++batch.end;
    }
    batches.push_back(batch);
    i = batch.end;
  }
  return batches;
}

double PaddingFraction(const std::vector<Batch>& batches, absl::Span<const int64_t> source_lengths,
                       absl::Span<const int64_t> target_lengths) {
  int64_t real = 0;
  int64_t padded = 0;
  for (const Batch& b : batches) {
    int64_t longest_source = 0;
    int64_t longest_target = 0;
    for (int64_t i = b.begin; i < b.end; ++i) {
      real += source_lengths[i] + target_lengths[i];
      longest_source = std::max(longest_source, source_lengths[i]);
      longest_target = std::max(longest_target, target_lengths[i]);
    }
    padded += (b.end - b.begin) * (longest_source + longest_target);
  }
  return padded == 0 ? 0.0 : 1.0 - static_cast<double>(real) / static_cast<double>(padded);
}

}  // namespace knnserve
