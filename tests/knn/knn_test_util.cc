#include "tests/knn/knn_test_util.h"

#include <filesystem>
#include <random>

#include "client/knn/subset_selector.h"
#include "common/check.h"
#include "common/datastore/key_source.h"
#include "common/index/builder.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace knnserve::testing {

model::TransformerModel MakeTinyModel(uint64_t seed) {
  torch::manual_seed(seed);
  model::TransformerConfig config;
  config.src_vocab_size = config.tgt_vocab_size = kTinyVocab;
  config.d_model = kTinyDim;
  config.encoder_layers = config.decoder_layers = 2;
  config.encoder_heads = config.decoder_heads = 4;
  config.encoder_ffn_dim = config.decoder_ffn_dim = 64;
  config.max_source_positions = config.max_target_positions = 64;
  config.dropout = 0;
  KNNSERVE_CHECK(config.Validate().ok(), "tiny model config");
  model::TransformerModel model(config);
  model->eval();
  return model;
}

std::vector<TokenPair> MakePairs(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> length(3, 8);
  std::uniform_int_distribution<int64_t> token(4, kTinyVocab - 1);
  std::vector<TokenPair> pairs(n);
  for (TokenPair& pair : pairs) {
    for (int i = length(rng); i > 0; --i) pair.source.push_back(token(rng));
    for (int i = length(rng); i > 0; --i) pair.target.push_back(token(rng));
  }
  return pairs;
}

torch::Tensor SourceBatch(const std::vector<TokenPair>& pairs) {
  size_t longest = 0;
  for (const TokenPair& p : pairs) longest = std::max(longest, p.source.size() + 1);
  torch::Tensor batch = torch::full(
      {static_cast<int64_t>(pairs.size()), static_cast<int64_t>(longest)}, 1, torch::kLong);  // pad
  for (size_t i = 0; i < pairs.size(); ++i) {
    for (size_t j = 0; j < pairs[i].source.size(); ++j) {
      batch[i][j] = pairs[i].source[j];
    }
    batch[i][pairs[i].source.size()] = 2;  // EOS
  }
  return batch;
}

TestDatastore BuildTestDatastore(model::TransformerModel& model,
                                 const std::vector<TokenPair>& pairs, const std::string& factory,
                                 int shards, const std::string& name) {
  torch::NoGradGuard no_grad;
  const int64_t eos = model->config().eos_id;
  std::vector<float> keys;
  DatastoreValues values;
  values.offsets.push_back(0);
  std::vector<float> sentence_keys;
  for (const TokenPair& pair : pairs) {
    const model::EncoderOutput encoded = model->Encode(SourceBatch({pair}));
    std::vector<int64_t> prev = {eos};
    prev.insert(prev.end(), pair.target.begin(), pair.target.end());
    const torch::Tensor features =
        model->Decode(torch::tensor(prev, torch::kLong).unsqueeze(0), encoded)
            .features.squeeze(0)
            .contiguous();
    keys.insert(keys.end(), features.data_ptr<float>(),
                features.data_ptr<float>() + features.numel());
    for (int64_t t : pair.target) values.tokens.push_back(static_cast<int32_t>(t));
    values.tokens.push_back(static_cast<int32_t>(eos));
    values.offsets.push_back(static_cast<int64_t>(values.tokens.size()));
    const torch::Tensor embedding = model::AverageEncoderStates(encoded);
    sentence_keys.insert(sentence_keys.end(), embedding.data_ptr<float>(),
                         embedding.data_ptr<float>() + embedding.numel());
  }
  const std::string dir = FreshTempDir("knn_" + name).string();
  const MatrixView<const float> key_view{keys.data(), static_cast<int64_t>(values.tokens.size()),
                                         kTinyDim};
  IndexBuildOptions options;
  options.factory = factory;
  options.shards = shards;
  options.progress.interactive = 0;
  const MemoryValueSource value_source(values);
  absl::StatusOr<IndexManifest> manifest =
      BuildIndex(MatrixKeySource(key_view), &value_source, options, dir + "/index");
  KNNSERVE_CHECK(manifest.ok(), std::string(manifest.status().message()).c_str());
  options.factory = "Flat";
  options.shards = 1;
  const MatrixView<const float> sentence_view{sentence_keys.data(),
                                              static_cast<int64_t>(pairs.size()), kTinyDim};
  manifest = BuildIndex(MatrixKeySource(sentence_view), nullptr, options, dir + "/sentence_index");
  KNNSERVE_CHECK(manifest.ok(), std::string(manifest.status().message()).c_str());
  return {dir + "/index", dir + "/sentence_index", static_cast<int64_t>(pairs.size()),
          static_cast<int64_t>(values.tokens.size())};
}

}  // namespace knnserve::testing
