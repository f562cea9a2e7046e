// Token-bucketed batching of encoded parallel data for training and teacher-forced passes.
#ifndef KNNSERVE_CLIENT_TRAIN_BATCHING_H_
#define KNNSERVE_CLIENT_TRAIN_BATCHING_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "client/data/parallel_corpus.h"
#include "client/tokenizer/tokenizer.h"

namespace knnserve::train {

// One encoded pair; both sides end with EOS.
struct Example {
  std::vector<int> source;
  std::vector<int> target;
};

struct EncodeStats {
  int64_t kept = 0;
  int64_t dropped_too_long = 0;  // a side longer than max_len tokens (with EOS)
  int64_t dropped_empty = 0;     // a side with no tokens
};

// Encodes pairs with `tokenizer`, appending EOS. Pairs with an empty side or a side longer than
// `max_len` are dropped (counted in `stats`, which may be null). `threads` >= 1.
absl::StatusOr<std::vector<Example>> EncodePairs(const Tokenizer& tokenizer,
                                                 const std::vector<data::SentencePair>& pairs,
                                                 int64_t max_len, int threads, EncodeStats* stats);

// Groups example indices into batches: examples sorted by (source, target) length, each batch
// holding as many as fit in max_tokens = rows * longest side. Batch order is shuffled with
// `seed` (no shuffle when seed == 0). REQUIRES: max_tokens > 0.
std::vector<std::vector<int64_t>> MakeBatches(const std::vector<Example>& examples,
                                              int64_t max_tokens, uint64_t seed);

struct TensorBatch {
  torch::Tensor src;          // [rows, src_len] int64, right-padded
  torch::Tensor prev_tokens;  // [rows, tgt_len]: EOS, then the target shifted right
  torch::Tensor target;       // [rows, tgt_len]: the target (ends with EOS), right-padded
  int64_t target_tokens = 0;  // non-pad target tokens
};

TensorBatch Collate(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
                    int64_t pad_id, int64_t eos_id);

}  // namespace knnserve::train

#endif  // KNNSERVE_CLIENT_TRAIN_BATCHING_H_
