// Subset kNN-MT's first stage: embed each source sentence with the datastore's sentence encoder
// and retrieve its n nearest datastore sentences from the sentence index.
#ifndef KNNSERVE_CLIENT_KNN_SUBSET_SELECTOR_H_
#define KNNSERVE_CLIENT_KNN_SUBSET_SELECTOR_H_

#include <torch/torch.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/knn/knn_processor.h"
#include "common/request.h"
#include "common/search_engine.h"

namespace knnserve::knn {

// Selects the n nearest datastore sentences (by model::AverageEncoderStates) in a sentence index
// whose ids are datastore sentence numbers (`knnserve datastore build` writes it to
// DIR/sentence_index/, an index directory of one embedding per sentence). Thread-safe: Select
// only reads (the index search is const).
class SentenceIndexSelector : public SubsetSelector {
 public:
  // REQUIRES: n >= 1. `index` holds one embedding per datastore sentence (id = sentence).
  static absl::StatusOr<std::unique_ptr<SentenceIndexSelector>> Create(
      std::unique_ptr<SearchEngine> index, int n);
  // Loads the sentence index directory `dir` (all shards) searched with `threads` threads.
  static absl::StatusOr<std::unique_ptr<SentenceIndexSelector>> Load(const std::string& dir, int n,
                                                                     int threads);

  absl::StatusOr<SubsetGroups> Select(const torch::Tensor& src_tokens,
                                      const model::EncoderOutput& encoder_out) override;

  // Sentences the index holds (one embedding each).
  int64_t num_sentences() const { return index_->info().total_vectors; }

 private:
  SentenceIndexSelector(std::unique_ptr<SearchEngine> index, int n)
      : index_(std::move(index)), n_(n) {}

  const std::unique_ptr<SearchEngine> index_;
  const RequestLimits limits_;
  const int n_;
};

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_SUBSET_SELECTOR_H_
