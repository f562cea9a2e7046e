// Small models and inputs shared by the client tests.
#ifndef KNNSERVE_TESTS_CLIENT_TEST_MODELS_H_
#define KNNSERVE_TESTS_CLIENT_TEST_MODELS_H_

#include <torch/torch.h>

#include <ostream>
#include <string>

#include "client/model/transformer.h"

namespace knnserve::testing {

struct TinyModelOptions {
  bool pre_norm = false;
  bool learned_positions = false;
  bool tied = true;
  bool layernorm_embedding = false;
  std::string activation = "relu";
};

// Names a variant in test output, e.g. "pre_norm,gelu" (the default is "post_norm,relu").
inline void PrintTo(const TinyModelOptions& o, std::ostream* os) {
  *os << (o.pre_norm ? "pre_norm" : "post_norm") << (o.learned_positions ? ",learned_pos" : "")
      << (o.tied ? "" : ",untied") << (o.layernorm_embedding ? ",layernorm_embedding" : "")
      << "," << o.activation;
}

inline model::TransformerConfig TinyConfig(const TinyModelOptions& o = {}) {
  model::TransformerConfig c;
  c.src_vocab_size = c.tgt_vocab_size = 40;
  c.d_model = 32;
  c.encoder_layers = c.decoder_layers = 2;
  c.encoder_heads = c.decoder_heads = 4;
  c.encoder_ffn_dim = c.decoder_ffn_dim = 48;
  c.encoder_normalize_before = c.decoder_normalize_before = o.pre_norm;
  c.learned_positions = o.learned_positions;
  c.share_all_embeddings = c.share_decoder_input_output_embed = o.tied;
  c.layernorm_embedding = o.layernorm_embedding;
  c.activation = o.activation;
  c.max_source_positions = c.max_target_positions = 64;
  c.dropout = 0.0;
  return c;
}

// A seeded model in eval mode.
inline model::TransformerModel TinyModel(const TinyModelOptions& o = {}, uint64_t seed = 7) {
  torch::manual_seed(seed);
  model::TransformerModel m(TinyConfig(o));
  m->eval();
  return m;
}

// [batch, len] source rows of random real tokens (ids >= 4) ending with EOS, the given lengths
// (EOS included), right-padded.
inline torch::Tensor RandomSources(const std::vector<int64_t>& lengths, int64_t vocab,
                                   uint64_t seed = 11) {
  torch::manual_seed(seed);
  int64_t longest = 0;
  for (int64_t l : lengths) longest = std::max(longest, l);
  torch::Tensor src = torch::full({static_cast<int64_t>(lengths.size()), longest}, 1, torch::kLong);
  for (size_t r = 0; r < lengths.size(); ++r) {
    src[r].narrow(0, 0, lengths[r] - 1).copy_(torch::randint(4, vocab, {lengths[r] - 1}));
    src[r][lengths[r] - 1] = 2;
  }
  return src;
}

}  // namespace knnserve::testing

#endif  // KNNSERVE_TESTS_CLIENT_TEST_MODELS_H_
