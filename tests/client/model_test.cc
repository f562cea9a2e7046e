#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "client/model/attention.h"
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
    EXPECT_LT((step.features.squeeze(1) - full.features.select(1, t)).abs().max().item<float>(),
              1e-5);
    EXPECT_LT((step.ffn_in.squeeze(1) - full.ffn_in.select(1, t)).abs().max().item<float>(), 1e-5);
  }
  EXPECT_EQ(state.step, prev.size(1));
  EXPECT_EQ(state.layers[0].self_k.size(2), prev.size(1));
}

INSTANTIATE_TEST_SUITE_P(
    Variants, IncrementalDecodingTest,
    ::testing::Values(TinyModelOptions{}, TinyModelOptions{.pre_norm = true},
                      TinyModelOptions{.learned_positions = true, .tied = false},
                      TinyModelOptions{
                          .pre_norm = true, .layernorm_embedding = true, .activation = "gelu"}));

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

// A beam's rows reading one copy of their sentence's encoder states (3 rows per sentence) decode
// what rows with a copy each decode, also after a sentence leaves and the rest are reordered.
TEST(TransformerTest, SharedEncoderStatesEqualOneCopyPerRow) {
  torch::NoGradGuard no_grad;
  TransformerModel model = TinyModel();
  constexpr int64_t kBeam = 3;
  EncoderOutput encoder_out = model->Encode(RandomSources({6, 3, 5}, 40));
  const torch::Tensor expand = torch::arange(3, torch::kLong).repeat_interleave(kBeam);
  DecoderState shared = model->InitDecoderState(encoder_out);
  DecoderState copied = model->InitDecoderState(encoder_out);
  ReorderDecoderState(copied, expand);
  torch::manual_seed(5);
  const torch::Tensor tokens = torch::randint(4, 40, {3 * kBeam, 4});
  for (int64_t t = 0; t < 2; ++t) {
    const DecoderOutput a = model->DecodeStep(tokens.select(1, t), encoder_out, shared);
    const DecoderOutput b = model->DecodeStep(tokens.select(1, t), encoder_out, copied);
    EXPECT_LT((a.logits - b.logits).abs().max().item<float>(), 1e-5) << "step " << t;
  }
  // Sentence 1 leaves; sentence 2's rows swap hypotheses, sentence 0's keep theirs.
  const torch::Tensor rows = torch::tensor({0, 1, 2, 8, 6, 7}, torch::kLong);
  ReorderSelfAttentionState(shared, rows);
  SelectEncoderStates(shared, torch::tensor({0, 2}, torch::kLong));
  ReorderDecoderState(copied, rows);
  EXPECT_EQ(shared.layers[0].enc_k.size(0), 2);
  const torch::Tensor next = tokens.select(1, 2).index_select(0, rows);
  const DecoderOutput a = model->DecodeStep(next, encoder_out, shared);
  const DecoderOutput b = model->DecodeStep(next, encoder_out, copied);
  EXPECT_LT((a.logits - b.logits).abs().max().item<float>(), 1e-5);
}

// ReorderDecoderState would pick encoder rows by decoder row numbers in a shared state: refused.
TEST(TransformerDeathTest, ReorderOfASharedEncoderStateIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  torch::NoGradGuard no_grad;
  TransformerModel model = TinyModel();
  EncoderOutput encoder_out = model->Encode(RandomSources({6, 3}, 40));
  DecoderState shared = model->InitDecoderState(encoder_out);
  model->DecodeStep(torch::tensor({4, 5, 6, 7}, torch::kLong), encoder_out, shared);  // G = 2
  EXPECT_DEATH(ReorderDecoderState(shared, torch::tensor({3, 2, 1, 0}, torch::kLong)),
               "one decoder row per encoder row");
}

// The reference: softmax(q kᵀ) v through matmul, masked keys at −inf.
torch::Tensor MatmulAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask) {
  torch::Tensor scores = torch::matmul(q.transpose(1, 2), k.transpose(-2, -1));  // [B, H, Lq, Lk]
  if (mask.defined()) {
    scores = scores.masked_fill(mask.view({mask.size(0), 1, 1, mask.size(1)}),
                                -std::numeric_limits<float>::infinity());
  }
  return torch::matmul(torch::softmax(scores, -1), v)
      .transpose(1, 2)
      .reshape({q.size(0), q.size(1), -1});
}

TEST(FewQueryAttention, EqualsTheMatmulForm) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(11);
  for (const int64_t queries : {1, 5}) {
    for (const int64_t head_dim : {64, 13}) {
      const int64_t batch = 4, heads = 3, keys = 9;
      const torch::Tensor q = torch::randn({batch, queries, heads, head_dim});
      // Keys as the caches hold them: a transposed projection [B, Lk, H, dh] and a slice of a
      // longer buffer.
      const torch::Tensor k = torch::randn({batch, keys, heads, head_dim}).transpose(1, 2);
      const torch::Tensor v = torch::randn({batch, heads, keys + 4, head_dim}).narrow(2, 2, keys);
      torch::Tensor mask = torch::zeros({batch, keys}, torch::kBool);
      mask[1].narrow(0, 6, 3).fill_(true);
      mask[3][0] = true;
      for (const torch::Tensor& m : {torch::Tensor(), mask}) {
        ASSERT_TRUE(CanAttendFewQueries(q, k, v, m));
        const torch::Tensor got = AttendFewQueries(q, k, v, m);
        ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{batch, queries, heads * head_dim}));
        EXPECT_LT((got - MatmulAttention(q, k, v, m)).abs().max().item<float>(), 1e-5)
            << queries << " queries, head_dim " << head_dim << (m.defined() ? ", masked" : "");
      }
    }
  }
}

TEST(FewQueryAttention, ARowsOutputDoesNotDependOnTheOtherRows) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(12);
  const torch::Tensor q = torch::randn({40, 5, 4, 64});
  const torch::Tensor k = torch::randn({40, 4, 30, 64});
  const torch::Tensor v = torch::randn({40, 4, 30, 64});
  const torch::Tensor all = AttendFewQueries(q, k, v, torch::Tensor());
  const torch::Tensor one =
      AttendFewQueries(q.narrow(0, 17, 1), k.narrow(0, 17, 1), v.narrow(0, 17, 1), torch::Tensor());
  EXPECT_TRUE(torch::equal(all.narrow(0, 17, 1), one));
}

TEST(FewQueryAttention, TakesOnlyWhatItComputes) {
  torch::NoGradGuard no_grad;
  const torch::Tensor q = torch::randn({2, 1, 2, 8});
  const torch::Tensor k = torch::randn({2, 2, 5, 8});
  EXPECT_TRUE(CanAttendFewQueries(q, k, k, torch::Tensor()));
  EXPECT_FALSE(CanAttendFewQueries(q.to(torch::kDouble), k.to(torch::kDouble), k.to(torch::kDouble),
                                   torch::Tensor()));
  EXPECT_FALSE(
      CanAttendFewQueries(torch::randn({2, kMaxFewQueries + 1, 2, 8}), k, k, torch::Tensor()));
  EXPECT_FALSE(CanAttendFewQueries(q, k.transpose(2, 3).contiguous().transpose(2, 3), k,
                                   torch::Tensor()));  // keys strided along dh
  const torch::Tensor no_keys = torch::randn({2, 2, 0, 8});
  EXPECT_FALSE(CanAttendFewQueries(q, no_keys, no_keys, torch::Tensor()));
  EXPECT_FALSE(CanAttendFewQueries(q, k, k, torch::zeros({2, 4}, torch::kBool)));
  EXPECT_FALSE(CanAttendFewQueries(q, k, k, torch::zeros({2, 5})));  // not bool
  torch::Tensor trained = k.clone().set_requires_grad(true);
  {
    torch::AutoGradMode grad(true);
    EXPECT_FALSE(CanAttendFewQueries(q, trained, k, torch::Tensor()));
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
