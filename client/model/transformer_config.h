// Hyper-parameters of the reference transformer (fairseq's `transformer` architecture). Plain
// data without Torch, so tools can read a checkpoint's config without pulling in LibTorch.
#ifndef KNNSERVE_CLIENT_MODEL_TRANSFORMER_CONFIG_H_
#define KNNSERVE_CLIENT_MODEL_TRANSFORMER_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace knnserve::model {

struct TransformerConfig {
  int64_t src_vocab_size = 0;
  int64_t tgt_vocab_size = 0;
  int64_t pad_id = 1;  // fairseq's dictionary order: <s>=0 <pad>=1 </s>=2 <unk>=3
  int64_t eos_id = 2;
  int64_t d_model = 512;
  int64_t encoder_layers = 6;
  int64_t decoder_layers = 6;
  int64_t encoder_heads = 8;
  int64_t decoder_heads = 8;
  int64_t encoder_ffn_dim = 2048;
  int64_t decoder_ffn_dim = 2048;
  bool encoder_normalize_before = false;  // pre-norm (true) or post-norm (false)
  bool decoder_normalize_before = false;
  bool learned_positions = false;  // learned or sinusoidal position embeddings
  int64_t max_source_positions = 1024;
  int64_t max_target_positions = 1024;
  bool share_all_embeddings = true;               // one embedding for encoder and decoder
  bool share_decoder_input_output_embed = true;   // tied output projection
  bool no_scale_embedding = false;                // false: embeddings scaled by sqrt(d_model)
  bool layernorm_embedding = false;
  std::string activation = "relu";  // relu | gelu
  double dropout = 0.1;
  double attention_dropout = 0.0;
  double activation_dropout = 0.0;

  // Checks consistency (positive sizes, heads divide d_model, shared vocabularies agree).
  absl::Status Validate() const;
  std::string ToJson() const;
  static absl::StatusOr<TransformerConfig> FromJson(const std::string& json);
};

}  // namespace knnserve::model

#endif  // KNNSERVE_CLIENT_MODEL_TRANSFORMER_CONFIG_H_
