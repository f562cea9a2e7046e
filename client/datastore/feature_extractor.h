// What the key computation asks of an NMT model: for a batch of datastore sentences, the
// feature of every target position (the kNN key) and a sentence embedding. The reference
// transformer implements it (TransformerExtractor below); other models or sentence encoders
// implement the same interface. This header does not include Torch.
#ifndef KNNSERVE_CLIENT_DATASTORE_FEATURE_EXTRACTOR_H_
#define KNNSERVE_CLIENT_DATASTORE_FEATURE_EXTRACTOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/matrix.h"

namespace knnserve::datastore {

// Sentences as values.h5 stores them: token ids ending with EOS. Spans borrow the caller's
// memory.
struct SentenceBatch {
  std::vector<absl::Span<const int32_t>> sources;
  std::vector<absl::Span<const int32_t>> targets;  // same size as sources
};

// Thread-compatible: one batch at a time (an implementation may use several threads inside).
class FeatureExtractor {
 public:
  virtual ~FeatureExtractor() = default;
  virtual int dim() const = 0;
  // Longest source / target (EOS included) the model accepts.
  virtual int64_t max_source_length() const = 0;
  virtual int64_t max_target_length() const = 0;
  // One row per target token, sentence after sentence: row j of sentence i is the feature the
  // decoder computes from the source and the target prefix y_<j (teacher forcing; the decoder
  // input starts with EOS), i.e. the query that predicts target token j.
  virtual absl::StatusOr<Matrix<float>> TokenFeatures(const SentenceBatch& batch) = 0;
  // One row per sentence: its embedding (the transformer: mean of the encoder output over the
  // source tokens, EOS included; knn-seq's "AvgEnc").
  virtual absl::StatusOr<Matrix<float>> SentenceEmbeddings(const SentenceBatch& batch) = 0;
};

// The features the reference transformer offers as keys.
inline constexpr char kFeatureDecoderOut[] = "decoder_out";  // input of the output projection
inline constexpr char kFeatureFfnIn[] = "ffn_in";            // input of the last layer's FFN

struct LoadedExtractor {
  std::unique_ptr<FeatureExtractor> extractor;
  std::string tokenizer;  // the checkpoint's serialized SentencePiece model ("" if none)
  int64_t vocab_size = 0;  // target vocabulary
  int64_t pad_id = 1;
  int64_t eos_id = 2;
};

// Loads a checkpoint (client/model/checkpoint.h) for feature extraction. `feature` is
// kFeatureDecoderOut or kFeatureFfnIn; `device` "cpu" or "cuda[:N]" (CUDA LibTorch builds).
absl::StatusOr<LoadedExtractor> LoadTransformerExtractor(const std::string& checkpoint_path,
                                                         const std::string& feature,
                                                         const std::string& device);

}  // namespace knnserve::datastore

#endif  // KNNSERVE_CLIENT_DATASTORE_FEATURE_EXTRACTOR_H_
