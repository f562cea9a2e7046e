#include "client/train/batching.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"

namespace knnserve::train {

absl::StatusOr<std::vector<Example>> EncodePairs(const Tokenizer& tokenizer,
                                                 const std::vector<data::SentencePair>& pairs,
                                                 int64_t max_len, int threads,
                                                 EncodeStats* stats) {
  std::vector<Example> encoded(pairs.size());
  std::vector<absl::Status> errors(std::max(threads, 1));
  auto work = [&](int worker) {
    for (size_t i = worker; i < pairs.size(); i += errors.size()) {
      absl::StatusOr<std::vector<int>> src = tokenizer.Encode(pairs[i].source);
      absl::StatusOr<std::vector<int>> tgt = tokenizer.Encode(pairs[i].target);
      if (!src.ok() || !tgt.ok()) {
        errors[worker] = !src.ok() ? src.status() : tgt.status();
        return;
      }
      encoded[i].source = std::move(*src);
      encoded[i].target = std::move(*tgt);
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < errors.size(); ++w) pool.emplace_back(work, static_cast<int>(w));
  work(0);
  for (std::thread& t : pool) t.join();
  for (const absl::Status& error : errors) {
    if (!error.ok()) return error;
  }
  EncodeStats local;
  std::vector<Example> kept;
  kept.reserve(encoded.size());
  for (Example& e : encoded) {
    if (e.source.empty() || e.target.empty()) {
      ++local.dropped_empty;
      continue;
    }
    e.source.push_back(tokenizer.eos_id());
    e.target.push_back(tokenizer.eos_id());
    if (static_cast<int64_t>(e.source.size()) > max_len ||
        static_cast<int64_t>(e.target.size()) > max_len) {
      ++local.dropped_too_long;
      continue;
    }
    kept.push_back(std::move(e));
  }
  local.kept = static_cast<int64_t>(kept.size());
  if (stats != nullptr) *stats = local;
  return kept;
}

std::vector<std::vector<int64_t>> MakeBatches(const std::vector<Example>& examples,
                                              int64_t max_tokens, uint64_t seed) {
  std::vector<int64_t> order(examples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const auto& ea = examples[a];
    const auto& eb = examples[b];
    if (ea.source.size() != eb.source.size()) return ea.source.size() < eb.source.size();
    return ea.target.size() < eb.target.size();
  });
  std::vector<std::vector<int64_t>> batches;
  std::vector<int64_t> current;
  int64_t longest = 0;
  for (int64_t i : order) {
    const int64_t len = static_cast<int64_t>(
        std::max(examples[i].source.size(), examples[i].target.size()));
    const int64_t new_longest = std::max(longest, len);
    if (!current.empty() && new_longest * static_cast<int64_t>(current.size() + 1) > max_tokens) {
      batches.push_back(std::move(current));
      current.clear();
      longest = len;
    } else {
      longest = new_longest;
    }
    current.push_back(i);
  }
  if (!current.empty()) batches.push_back(std::move(current));
  if (seed != 0) {
    std::mt19937_64 rng(seed);
    std::shuffle(batches.begin(), batches.end(), rng);
  }
  return batches;
}

TensorBatch Collate(const std::vector<Example>& examples, const std::vector<int64_t>& indices,
                    int64_t pad_id, int64_t eos_id) {
  const int64_t rows = static_cast<int64_t>(indices.size());
  size_t src_len = 0;
  size_t tgt_len = 0;
  for (int64_t i : indices) {
    src_len = std::max(src_len, examples[i].source.size());
    tgt_len = std::max(tgt_len, examples[i].target.size());
  }
  TensorBatch batch;
  batch.src = torch::full({rows, static_cast<int64_t>(src_len)}, pad_id, torch::kLong);
  batch.target = torch::full({rows, static_cast<int64_t>(tgt_len)}, pad_id, torch::kLong);
  batch.prev_tokens = torch::full({rows, static_cast<int64_t>(tgt_len)}, pad_id, torch::kLong);
  auto src = batch.src.accessor<int64_t, 2>();
  auto tgt = batch.target.accessor<int64_t, 2>();
  auto prev = batch.prev_tokens.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    const Example& e = examples[indices[r]];
    for (size_t j = 0; j < e.source.size(); ++j) src[r][j] = e.source[j];
    prev[r][0] = eos_id;
    for (size_t j = 0; j < e.target.size(); ++j) {
      tgt[r][j] = e.target[j];
      if (j + 1 < e.target.size()) prev[r][j + 1] = e.target[j];
    }
    batch.target_tokens += static_cast<int64_t>(e.target.size());
  }
  return batch;
}

}  // namespace knnserve::train
