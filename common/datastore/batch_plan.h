// Token-budgeted batches for the key computation. Sentences are taken in the order given (the
// datastore's stored order is sorted by length, so neighbours pad little); a batch grows while
// (sentences in it) x (its longest sentence) stays within max_tokens and its size within
// max_sentences. A sentence longer than max_tokens gets a batch of its own.
#ifndef KNNSERVE_COMMON_DATASTORE_BATCH_PLAN_H_
#define KNNSERVE_COMMON_DATASTORE_BATCH_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace knnserve {

struct Batch {
  int64_t begin = 0;  // positions [begin, end) of the sequence given to PlanBatches
  int64_t end = 0;
  int64_t max_length = 0;  // the padded length of the batch
};

// lengths[i]: the padded-tensor length sentence i needs (max of its source and target lengths).
// REQUIRES: max_tokens > 0, max_sentences > 0.
std::vector<Batch> PlanBatches(absl::Span<const int64_t> lengths, int64_t max_tokens,
                               int64_t max_sentences);

// Padding of a plan over both sides: 1 - real tokens / padded tokens, where a batch pads every
// source to its longest source and every target to its longest target.
double PaddingFraction(const std::vector<Batch>& batches, absl::Span<const int64_t> source_lengths,
                       absl::Span<const int64_t> target_lengths);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_BATCH_PLAN_H_
