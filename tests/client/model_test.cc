#include <torch/torch.h>

#include <cmath>
#include <set>
#include <string>

#include "client/model/transformer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/test_models.h"

namespace knnserve::model {
namespace {

using ::knnserve::testing::RandomSources;
using ::knnserve::testing::TinyModel;
using ::knnserve::testing::TinyModelOptions;

std::set<std::string> ParameterNames(TransformerModel& model) {
  std::set<std::string> names;
  for (const auto& item : model->named_parameters()) names.insert(item.key());
  return names;
}

TEST(TransformerTest, ParameterNamesAndShapesFollowFairseq) {
  TransformerModel model = TinyModel();
  const std::set<std::string> names = ParameterNames(model);
  for (const char* name :
       {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
        "encoder.layers.0.self_attn.q_proj.weight", "encoder.layers.1.self_attn.out_proj.bias",
        "encoder.layers.1.self_attn_layer_norm.weight", "encoder.layers.0.fc1.weight",
        "encoder.layers.0.fc2.bias", "encoder.layers.1.final_layer_norm.bias",
        "decoder.layers.0.self_attn.k_proj.weight", "decoder.layers.1.encoder_attn.v_proj.bias",
        "decoder.layers.1.encoder_attn_layer_norm.weight",
        "decoder.layers.0.final_layer_norm.weight"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
  // Post-norm has no final encoder/decoder layer norm; tied output uses the embedding.
  EXPECT_FALSE(names.count("encoder.layer_norm.weight"));
  EXPECT_FALSE(names.count("decoder.output_projection.weight"));
  EXPECT_FALSE(names.count("encoder.embed_positions.weight"));
  auto params = model->named_parameters();
  EXPECT_EQ(params["encoder.layers.0.fc1.weight"].sizes(), (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(params["encoder.layers.0.fc2.weight"].sizes(), (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(params["encoder.embed_tokens.weight"].sizes(), (std::vector<int64_t>{40, 32}));
}

TEST(TransformerTest, SharedEmbeddingIsOneTensorStoredOnce) {
  TransformerModel model = TinyModel();
  auto params = model->named_parameters();
  EXPECT_TRUE(params["encoder.embed_tokens.weight"].is_same(params["decoder.embed_tokens.weight"]));
  std::set<std::string> unique;
  for (const auto& [name, tensor] : model->UniqueNamedParameters()) unique.insert(name);
  EXPECT_TRUE(unique.count("encoder.embed_tokens.weight"));
  EXPECT_FALSE(unique.count("decoder.embed_tokens.weight"));
}

TEST(TransformerTest, OptionalModulesAppearUnderFairseqNames) {
  TinyModelOptions options;
  options.pre_norm = true;
  options.learned_positions = true;
  options.tied = false;
  options.layernorm_embedding = true;
  TransformerModel model = TinyModel(options);
  const std::set<std::string> names = ParameterNames(model);
  for (const char* name :
       {"encoder.layer_norm.weight", "decoder.layer_norm.bias", "encoder.embed_positions.weight",
        "decoder.embed_positions.weight", "decoder.output_projection.weight",
        "encoder.layernorm_embedding.weight", "decoder.layernorm_embedding.bias"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
  // fairseq's LearnedPositionalEmbedding: max_positions + padding_idx + 1 rows.
  EXPECT_EQ(model->named_parameters()["encoder.embed_positions.weight"].size(0), 64 + 1 + 1);
}

TEST(TransformerTest, SinusoidalTableMatchesFairseqFormula) {
  const int64_t dim = 8, half = 4, pad = 1;
  torch::Tensor table = SinusoidalTable(10, dim, pad);
  EXPECT_EQ(table[pad].abs().sum().item<float>(), 0.0f);
  for (int64_t pos : {0, 2, 9}) {
    if (pos == pad) continue;
    for (int64_t k = 0; k < half; ++k) {
      const double freq = std::exp(-static_cast<double>(k) * std::log(10000.0) / (half - 1));
      EXPECT_NEAR(table[pos][k].item<float>(), std::sin(pos * freq), 1e-5);
      EXPECT_NEAR(table[pos][half + k].item<float>(), std::cos(pos * freq), 1e-5);
    }
  }
}

class IncrementalDecodingTest : public ::testing::TestWithParam<TinyModelOptions> {};

TEST_P(IncrementalDecodingTest, StepwiseOutputsEqualFullRecomputation) {
  torch::NoGradGuard no_grad;
  TransformerModel model = TinyModel(GetParam());
  torch::Tensor src = RandomSources({7, 4, 6}, 40);
  torch::manual_seed(3);
  torch::Tensor prev = torch::randint(4, 40, {3, 6});
  prev.select(1, 0).fill_(2);  // decoder input starts with EOS
  EncoderOutput encoder_out = model->Encode(src);
  DecoderOutput full = model->Decode(prev, encoder_out);
  DecoderState state = model->InitDecoderState(encoder_out);
  for (int64_t t = 0; t < prev.size(1); ++t) {
    DecoderOutput step = model->DecodeStep(prev.select(1, t), encoder_out, state);
    ASSERT_EQ(step.logits.size(1), 1);
    EXPECT_LT((step.logits.squeeze(1) - full.logits.select(1, t)).abs().max().item<float>(), 1e-5)
        << "step " << t;
    EXPECT_LT(
        (step.features.squeeze(1) - full.features.select(1, t)).abs().max().item<float>(), 1e-5);
    EXPECT_LT((step.ffn_in.squeeze(1) - full.ffn_in.select(1, t)).abs().max().item<float>(),
              1e-5);
  }
  EXPECT_EQ(state.step, prev.size(1));
  EXPECT_EQ(state.layers[0].self_k.size(2), prev.size(1));
}

INSTANTIATE_TEST_SUITE_P(
    Variants, IncrementalDecodingTest,
    ::testing::Values(TinyModelOptions{}, TinyModelOptions{.pre_norm = true},
                      TinyModelOptions{.learned_positions = true, .tied = false},
                      TinyModelOptions{.pre_norm = true, .layernorm_embedding = true,
                                       .activation = "gelu"}));

TEST(TransformerTest, ReorderedDecoderStateContinuesTheSelectedRows) {
  torch::NoGradGuard no_grad;
  TransformerModel model = TinyModel();
  torch::Tensor src = RandomSources({5, 5}, 40);
  torch::Tensor prev = torch::tensor({{2, 7, 9}, {2, 8, 10}}, torch::kLong);
  EncoderOutput encoder_out = model->Encode(src);
  DecoderOutput full = model->Decode(prev, encoder_out);

  DecoderState state = model->InitDecoderState(encoder_out);
  model->DecodeStep(prev.select(1, 0), encoder_out, state);
  model->DecodeStep(prev.select(1, 1), encoder_out, state);
  // Keep row 1 twice (as a beam that survives in two copies), drop row 0.
  ReorderDecoderState(state, torch::tensor({1, 1}, torch::kLong));
  DecoderOutput step = model->DecodeStep(torch::tensor({10, 10}, torch::kLong), encoder_out, state);
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_LT((step.logits[r][0] - full.logits[1][2]).abs().max().item<float>(), 1e-5);
  }
}

TEST(TransformerTest, EncoderPaddingDoesNotChangeResults) {
  torch::NoGradGuard no_grad;
  TransformerModel model = TinyModel();
  torch::Tensor batch = RandomSources({7, 4}, 40);
  torch::Tensor alone = batch[1].narrow(0, 0, 4).unsqueeze(0);
  torch::Tensor prev = torch::tensor({{2, 5, 6}}, torch::kLong);
  DecoderOutput batched = model->Decode(prev.repeat({2, 1}), model->Encode(batch));
  DecoderOutput single = model->Decode(prev, model->Encode(alone));
  EXPECT_LT((batched.logits[1] - single.logits[0]).abs().max().item<float>(), 1e-5);
}

TEST(TransformerTest, FeaturesWithoutLogitsEqualTheFullDecode) {
  torch::NoGradGuard no_grad;
  TransformerModel model = TinyModel();
  const EncoderOutput encoded = model->Encode(RandomSources({7, 4}, 40));
  const torch::Tensor prev = torch::tensor({{2, 5, 6}, {2, 8, 1}}, torch::kLong);
  const DecoderOutput full = model->Decode(prev, encoded);
  const DecoderOutput features = model->Decode(prev, encoded, /*with_logits=*/false);
  EXPECT_FALSE(features.logits.defined());
  EXPECT_TRUE(torch::equal(features.features, full.features));
  EXPECT_TRUE(torch::equal(features.ffn_in, full.ffn_in));
}

}  // namespace
}  // namespace knnserve::model
