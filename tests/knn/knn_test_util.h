// Test support for kNN-MT: a tiny randomly initialised transformer (fixed seed: retrieval
// wiring needs no trained model), random token-id sentence pairs, and a datastore + sharded
// index built from them in a temp directory (keys = the model's teacher-forced decoder
// features, values = target tokens + EOS, a Flat sentence index over AvgEnc embeddings).
#ifndef KNNSERVE_TESTS_KNN_KNN_TEST_UTIL_H_
#define KNNSERVE_TESTS_KNN_KNN_TEST_UTIL_H_

#include <torch/torch.h>

#include <string>
#include <vector>

#include "client/model/transformer.h"

namespace knnserve::testing {

inline constexpr int64_t kTinyVocab = 48;
inline constexpr int64_t kTinyDim = 32;

// Eval mode, no dropout, weights from torch::manual_seed(seed).
model::TransformerModel MakeTinyModel(uint64_t seed);

struct TokenPair {
  std::vector<int64_t> source;  // without EOS
  std::vector<int64_t> target;  // without EOS
};

// n pairs of 3..8 random non-special tokens per side.
std::vector<TokenPair> MakePairs(int n, uint32_t seed);

// [n, max_len] source batch: tokens + EOS, right-padded.
torch::Tensor SourceBatch(const std::vector<TokenPair>& pairs);

// The layout of `knnserve datastore build`: DIR/index/ and DIR/sentence_index/.
struct TestDatastore {
  std::string index_dir;           // token index: manifest + shards with values
  std::string sentence_index_dir;  // Flat index of AvgEnc sentence embeddings
  int64_t num_sentences = 0;
  int64_t num_tokens = 0;
};

// Builds the datastore of `pairs` with `model` into a fresh directory under the test temp dir.
// factory: faiss index_factory string ("Flat", "PQ4", ...); PQ factories get subset codes.
TestDatastore BuildTestDatastore(model::TransformerModel& model,
                                 const std::vector<TokenPair>& pairs, const std::string& factory,
                                 int shards, const std::string& name);

}  // namespace knnserve::testing

#endif  // KNNSERVE_TESTS_KNN_KNN_TEST_UTIL_H_
