// The reference encoder-decoder transformer in LibTorch, parameter for parameter fairseq's
// `transformer` architecture (names and shapes below), so fairseq checkpoints map 1:1:
//
//   encoder.embed_tokens.weight [V_src, d]       decoder.embed_tokens.weight [V_tgt, d]
//   encoder.embed_positions.weight (learned positions only), [max_pos + pad + 1, d]
//   encoder.layernorm_embedding.{weight,bias} (optional)
//   encoder.layers.N.self_attn.{q,k,v,out}_proj.{weight,bias}, self_attn_layer_norm,
//                    fc1 [ffn, d], fc2 [d, ffn], final_layer_norm
//   encoder.layer_norm (pre-norm only)
//   decoder.layers.N.self_attn.*, self_attn_layer_norm, encoder_attn.*,
//                    encoder_attn_layer_norm, fc1, fc2, final_layer_norm
//   decoder.layer_norm (pre-norm only), decoder.output_projection.weight [V_tgt, d] (untied only)
//
// With share_all_embeddings the decoder uses the encoder's embedding module (one tensor, two
// names); with tied output embeddings the logits use decoder.embed_tokens.weight.
// Sinusoidal positions follow fairseq exactly, including its padding_idx offset (the first
// real position is pad_id + 1). The decoder input starts with EOS, as in fairseq.
//
// Tensor layout is batch-first throughout: tokens [batch, len] int64 (right-padded with pad_id),
// states [batch, len, d] float.
//
// Thread-safety: a module is not safe for concurrent mutation (training). Concurrent inference
// calls (under torch::NoGradGuard, eval mode) on one model are safe: they only read parameters.
#ifndef KNNSERVE_CLIENT_MODEL_TRANSFORMER_H_
#define KNNSERVE_CLIENT_MODEL_TRANSFORMER_H_

#include <torch/torch.h>

#include <vector>

#include "client/model/transformer_config.h"

namespace knnserve::model {

struct EncoderOutput {
  torch::Tensor states;        // [batch, src_len, d]
  torch::Tensor padding_mask;  // [batch, src_len] bool, true at padding
};

// The sentence embedding of subset kNN-MT (knn-seq's "AvgEnc"): the mean of the encoder output
// over each sentence's non-padding positions (EOS included), [batch, d] float32 on the CPU.
// The datastore's sentence keys and the decoder's subset queries both use it.
torch::Tensor AverageEncoderStates(const EncoderOutput& encoder_out);

struct DecoderOutput {
  torch::Tensor logits;    // [batch, tgt_len, V_tgt] (unnormalized)
  torch::Tensor features;  // [batch, tgt_len, d]: the input of the output projection (kNN key)
  torch::Tensor ffn_in;    // [batch, tgt_len, d]: the input of the last layer's fc1
};

// Cached keys/values of an incremental decode. Reorder with ReorderDecoderState when beams
// are selected or finished rows dropped.
//
// The decoder rows may outnumber the encoder rows: with G = rows / encoder rows (a whole
// number), decoder row r attends to encoder row r / G. Beam search feeds a beam of G
// hypotheses per sentence of a fresh state, so they share one copy of its encoder keys and
// values instead of one copy per hypothesis.
struct DecoderState {
  struct Layer {
    torch::Tensor self_k, self_v;    // [rows, heads, steps so far, head_dim]
    torch::Tensor enc_k, enc_v;      // [rows / G, heads, src_len, head_dim]
    torch::Tensor enc_padding_mask;  // [rows / G, src_len], as enc_k
  };
  std::vector<Layer> layers;
  int64_t step = 0;  // number of tokens already fed
};

class MultiheadAttentionImpl : public torch::nn::Module {
 public:
  MultiheadAttentionImpl(int64_t d_model, int64_t heads, double dropout);

  // [batch, len, d] -> [batch, heads, len, head_dim], through k_proj / v_proj.
  torch::Tensor ProjectKey(const torch::Tensor& x);
  torch::Tensor ProjectValue(const torch::Tensor& x);
  // query [batch, q_len, d]; k, v [batch, heads, k_len, head_dim]; key_padding_mask [batch,
  // k_len] bool or undefined; causal: mask keys after each query (q_len == k_len).
  torch::Tensor Attend(const torch::Tensor& query, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& key_padding_mask, bool causal);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};

 private:
  torch::Tensor SplitHeads(const torch::Tensor& x) const;
  int64_t heads_;
  int64_t head_dim_;
  double dropout_;
};
TORCH_MODULE(MultiheadAttention);

class EncoderLayerImpl : public torch::nn::Module {
 public:
  explicit EncoderLayerImpl(const TransformerConfig& config);
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& padding_mask);

  MultiheadAttention self_attn{nullptr};
  torch::nn::LayerNorm self_attn_layer_norm{nullptr}, final_layer_norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  const TransformerConfig config_;
};
TORCH_MODULE(EncoderLayer);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const TransformerConfig& config);
  // Full (teacher-forced) pass when `cache` is null: x [batch, tgt_len, d], causal mask.
  // Incremental when `cache` is set: x [rows, 1, d]; appends to the cached self keys/values;
  // each cached encoder row serves rows / encoder rows of them (DecoderState). `ffn_in` (may be
  // null) receives the input of fc1.
  torch::Tensor forward(torch::Tensor x, const EncoderOutput& encoder_out,
                        DecoderState::Layer* cache, torch::Tensor* ffn_in);

  MultiheadAttention self_attn{nullptr}, encoder_attn{nullptr};
  torch::nn::LayerNorm self_attn_layer_norm{nullptr}, encoder_attn_layer_norm{nullptr},
      final_layer_norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  torch::Tensor FeedForward(torch::Tensor x, torch::Tensor* ffn_in);
  torch::Tensor AttendSharedEncoder(const torch::Tensor& x, const DecoderState::Layer& cache);
  const TransformerConfig config_;
};
TORCH_MODULE(DecoderLayer);

class TransformerEncoderImpl : public torch::nn::Module {
 public:
  TransformerEncoderImpl(const TransformerConfig& config, torch::nn::Embedding embed_tokens);
  // src_tokens [batch, src_len] (each row ends with EOS, then padding).
  EncoderOutput forward(const torch::Tensor& src_tokens);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::Embedding embed_positions{nullptr};      // learned positions only
  torch::nn::LayerNorm layernorm_embedding{nullptr};  // optional
  torch::nn::ModuleList layers{nullptr};
  torch::nn::LayerNorm layer_norm{nullptr};  // pre-norm only

 private:
  const TransformerConfig config_;
  torch::Tensor sinusoidal_;  // [max_positions + pad + 1, d]; a constant, not a parameter
};
TORCH_MODULE(TransformerEncoder);

class TransformerDecoderImpl : public torch::nn::Module {
 public:
  TransformerDecoderImpl(const TransformerConfig& config, torch::nn::Embedding embed_tokens);
  // Teacher-forced: prev_tokens [batch, tgt_len] = EOS followed by the target shifted right.
  // with_logits false leaves `logits` undefined: feature extraction skips the output
  // projection, a third of the decoder's work with an 8k vocabulary.
  DecoderOutput forward(const torch::Tensor& prev_tokens, const EncoderOutput& encoder_out,
                        bool with_logits = true);
  // Incremental decoding: computes the encoder keys/values once. Step then takes batch x G
  // tokens, G >= 1 consecutive decoder rows per encoder row (DecoderState).
  DecoderState InitState(const EncoderOutput& encoder_out);
  // tokens [batch]: the last token of every row (EOS at step 0). Outputs have tgt_len == 1;
  // with_logits false leaves `logits` undefined (Logits computes them later).
  DecoderOutput Step(const torch::Tensor& tokens, const EncoderOutput& encoder_out,
                     DecoderState& state, bool with_logits = true);
  // The output projection: features [..., d] -> unnormalized logits [..., V_tgt].
  torch::Tensor Logits(const torch::Tensor& features);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::Embedding embed_positions{nullptr};      // learned positions only
  torch::nn::LayerNorm layernorm_embedding{nullptr};  // optional
  torch::nn::ModuleList layers{nullptr};
  torch::nn::LayerNorm layer_norm{nullptr};      // pre-norm only
  torch::nn::Linear output_projection{nullptr};  // untied output embeddings only

 private:
  torch::Tensor Embed(const torch::Tensor& tokens, const torch::Tensor& positions);
  DecoderOutput Run(torch::Tensor x, const EncoderOutput& encoder_out, DecoderState* state,
                    bool with_logits);
  const TransformerConfig config_;
  torch::Tensor sinusoidal_;
};
TORCH_MODULE(TransformerDecoder);

class TransformerModelImpl : public torch::nn::Module {
 public:
  // REQUIRES: config.Validate().ok().
  explicit TransformerModelImpl(const TransformerConfig& config);

  const TransformerConfig& config() const { return config_; }

  EncoderOutput Encode(const torch::Tensor& src_tokens) { return encoder->forward(src_tokens); }
  DecoderOutput Decode(const torch::Tensor& prev_tokens, const EncoderOutput& encoder_out,
                       bool with_logits = true) {
    return decoder->forward(prev_tokens, encoder_out, with_logits);
  }
  DecoderState InitDecoderState(const EncoderOutput& encoder_out) {
    return decoder->InitState(encoder_out);
  }
  DecoderOutput DecodeStep(const torch::Tensor& tokens, const EncoderOutput& encoder_out,
                           DecoderState& state, bool with_logits = true) {
    return decoder->Step(tokens, encoder_out, state, with_logits);
  }
  torch::Tensor Logits(const torch::Tensor& features) { return decoder->Logits(features); }

  // Named parameters without duplicates (a shared embedding keeps its first name,
  // "encoder.embed_tokens.weight"): what checkpoints store and optimizers update.
  std::vector<std::pair<std::string, torch::Tensor>> UniqueNamedParameters() const;

  TransformerEncoder encoder{nullptr};
  TransformerDecoder decoder{nullptr};

 private:
  const TransformerConfig config_;
};
TORCH_MODULE(TransformerModel);

// Selects rows of every cached tensor: index [new_batch] int64 into the current batch.
// REQUIRES: one decoder row per encoder row (G = 1).
void ReorderDecoderState(DecoderState& state, const torch::Tensor& index);
// Selects rows of the self-attention keys and values only, for a reorder that keeps every row's
// encoder states: REQUIRES row index[i] and row i to read the same encoder row (as beam
// search's hypotheses of one sentence do while no sentence leaves the batch).
void ReorderSelfAttentionState(DecoderState& state, const torch::Tensor& index);
// Selects encoder rows (the cross-attention keys, values and padding mask): index [new_sources]
// int64 into the current ones. The caller reorders the decoder rows to match, in groups of
// G.
void SelectEncoderStates(DecoderState& state, const torch::Tensor& index);

// fairseq's sinusoidal table: [num_embeddings, dim], row pad_id zero.
torch::Tensor SinusoidalTable(int64_t num_embeddings, int64_t dim, int64_t pad_id);

}  // namespace knnserve::model

#endif  // KNNSERVE_CLIENT_MODEL_TRANSFORMER_H_
