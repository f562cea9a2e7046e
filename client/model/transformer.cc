#include "client/model/transformer.h"

#include <cmath>
#include <limits>
#include <unordered_set>

#include "client/model/attention.h"
#include "common/check.h"

namespace knnserve::model {
namespace {

namespace nn = torch::nn;

// fairseq's Embedding(): N(0, d^-0.5), padding row zero.
nn::Embedding MakeEmbedding(int64_t num, int64_t dim, int64_t pad) {
  nn::Embedding embedding(nn::EmbeddingOptions(num, dim).padding_idx(pad));
  torch::NoGradGuard no_grad;
  nn::init::normal_(embedding->weight, 0.0, std::pow(static_cast<double>(dim), -0.5));
  embedding->weight[pad].zero_();
  return embedding;
}

// fairseq's Linear(): xavier_uniform weight, zero bias.
nn::Linear MakeLinear(int64_t in, int64_t out, bool bias = true, double gain = 1.0) {
  nn::Linear linear(nn::LinearOptions(in, out).bias(bias));
  torch::NoGradGuard no_grad;
  nn::init::xavier_uniform_(linear->weight, gain);
  if (bias) linear->bias.zero_();
  return linear;
}

nn::LayerNorm MakeLayerNorm(int64_t dim) {
  return nn::LayerNorm(nn::LayerNormOptions({dim}).eps(1e-5));
}

// fairseq's utils.make_positions: real tokens count from pad + 1, padding gets pad.
torch::Tensor MakePositions(const torch::Tensor& tokens, int64_t pad) {
  torch::Tensor mask = tokens.ne(pad).to(torch::kLong);
  return torch::cumsum(mask, 1) * mask + pad;
}

torch::Tensor Activation(const torch::Tensor& x, const std::string& name) {
  return name == "gelu" ? torch::gelu(x) : torch::relu(x);
}

// Scaled token embeddings + positions (+ layernorm_embedding) with dropout.
// (Module holders are shared pointers: passed by value.)
torch::Tensor EmbedWithPositions(const TransformerConfig& config, nn::Embedding tokens_embed,
                                 nn::Embedding learned_positions, const torch::Tensor& sinusoidal,
                                 nn::LayerNorm layernorm_embedding, const torch::Tensor& tokens,
                                 const torch::Tensor& positions, bool training) {
  const double scale =
      config.no_scale_embedding ? 1.0 : std::sqrt(static_cast<double>(config.d_model));
  torch::Tensor x = tokens_embed->forward(tokens) * scale;
  if (learned_positions) {
    x = x + learned_positions->forward(positions);
  } else {
    x = x + sinusoidal.to(x.device())
                .index_select(0, positions.reshape({-1}))
                .view({positions.size(0), positions.size(1), -1});
  }
  if (layernorm_embedding) x = layernorm_embedding->forward(x);
  return torch::dropout(x, config.dropout, training);
}

}  // namespace

torch::Tensor SinusoidalTable(int64_t num_embeddings, int64_t dim, int64_t pad_id) {
  const int64_t half = dim / 2;
  const double step = std::log(10000.0) / static_cast<double>(half - 1);
  torch::Tensor freqs = torch::exp(torch::arange(half, torch::kFloat) * -step);
  torch::Tensor angles =
      torch::arange(num_embeddings, torch::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  torch::Tensor table = torch::cat({torch::sin(angles), torch::cos(angles)}, 1);
  if (dim % 2 == 1) table = torch::cat({table, torch::zeros({num_embeddings, 1})}, 1);
  table[pad_id].zero_();
  return table;
}

// ---------------------------------------------------------------------------------------------
MultiheadAttentionImpl::MultiheadAttentionImpl(int64_t d_model, int64_t heads, double dropout)
    : heads_(heads), head_dim_(d_model / heads), dropout_(dropout) {
  const double gain = 1.0 / std::sqrt(2.0);
  k_proj = register_module("k_proj", MakeLinear(d_model, d_model, true, gain));
  v_proj = register_module("v_proj", MakeLinear(d_model, d_model, true, gain));
  q_proj = register_module("q_proj", MakeLinear(d_model, d_model, true, gain));
  out_proj = register_module("out_proj", MakeLinear(d_model, d_model));
}

torch::Tensor MultiheadAttentionImpl::SplitHeads(const torch::Tensor& x) const {
  return x.view({x.size(0), x.size(1), heads_, head_dim_}).transpose(1, 2);
}

torch::Tensor MultiheadAttentionImpl::ProjectKey(const torch::Tensor& x) {
  return SplitHeads(k_proj->forward(x));
}

torch::Tensor MultiheadAttentionImpl::ProjectValue(const torch::Tensor& x) {
  return SplitHeads(v_proj->forward(x));
}

torch::Tensor MultiheadAttentionImpl::Attend(const torch::Tensor& query, const torch::Tensor& k,
                                             const torch::Tensor& v,
                                             const torch::Tensor& key_padding_mask, bool causal) {
  const int64_t batch = query.size(0);
  const int64_t q_len = query.size(1);
  const int64_t k_len = k.size(2);
  const torch::Tensor scaled_q =
      q_proj->forward(query) * std::pow(static_cast<double>(head_dim_), -0.5);
  if (!causal && !(is_training() && dropout_ > 0)) {
    const torch::Tensor heads_q = scaled_q.view({batch, q_len, heads_, head_dim_});
    if (CanAttendFewQueries(heads_q, k, v, key_padding_mask)) {
      return out_proj->forward(AttendFewQueries(heads_q, k, v, key_padding_mask));
    }
  }
  torch::Tensor q = SplitHeads(scaled_q);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1));  // [batch, heads, q, k]
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (key_padding_mask.defined()) {
    scores = scores.masked_fill(key_padding_mask.view({batch, 1, 1, k_len}), neg_inf);
  }
  if (causal) {
    torch::Tensor future =
        torch::ones({q_len, k_len}, torch::dtype(torch::kBool).device(q.device())).triu(1);
    scores = scores.masked_fill(future, neg_inf);
  }
  torch::Tensor probs = torch::dropout(torch::softmax(scores, -1), dropout_, is_training());
  torch::Tensor out = torch::matmul(probs, v).transpose(1, 2).reshape({batch, q_len, -1});
  return out_proj->forward(out);
}

// ---------------------------------------------------------------------------------------------
EncoderLayerImpl::EncoderLayerImpl(const TransformerConfig& config) : config_(config) {
  self_attn = register_module("self_attn", MultiheadAttention(config.d_model, config.encoder_heads,
                                                              config.attention_dropout));
  self_attn_layer_norm = register_module("self_attn_layer_norm", MakeLayerNorm(config.d_model));
  fc1 = register_module("fc1", MakeLinear(config.d_model, config.encoder_ffn_dim));
  fc2 = register_module("fc2", MakeLinear(config.encoder_ffn_dim, config.d_model));
  final_layer_norm = register_module("final_layer_norm", MakeLayerNorm(config.d_model));
}

torch::Tensor EncoderLayerImpl::forward(torch::Tensor x, const torch::Tensor& padding_mask) {
  const bool pre = config_.encoder_normalize_before;
  const bool training = is_training();
  torch::Tensor residual = x;
  if (pre) x = self_attn_layer_norm->forward(x);
  x = self_attn->Attend(x, self_attn->ProjectKey(x), self_attn->ProjectValue(x), padding_mask,
                        /*causal=*/false);
  x = residual + torch::dropout(x, config_.dropout, training);
  if (!pre) x = self_attn_layer_norm->forward(x);

  residual = x;
  if (pre) x = final_layer_norm->forward(x);
  x = torch::dropout(Activation(fc1->forward(x), config_.activation), config_.activation_dropout,
                     training);
  x = residual + torch::dropout(fc2->forward(x), config_.dropout, training);
  if (!pre) x = final_layer_norm->forward(x);
  return x;
}

// ---------------------------------------------------------------------------------------------
DecoderLayerImpl::DecoderLayerImpl(const TransformerConfig& config) : config_(config) {
  self_attn = register_module("self_attn", MultiheadAttention(config.d_model, config.decoder_heads,
                                                              config.attention_dropout));
  self_attn_layer_norm = register_module("self_attn_layer_norm", MakeLayerNorm(config.d_model));
  encoder_attn = register_module(
      "encoder_attn",
      MultiheadAttention(config.d_model, config.decoder_heads, config.attention_dropout));
  encoder_attn_layer_norm =
      register_module("encoder_attn_layer_norm", MakeLayerNorm(config.d_model));
  fc1 = register_module("fc1", MakeLinear(config.d_model, config.decoder_ffn_dim));
  fc2 = register_module("fc2", MakeLinear(config.decoder_ffn_dim, config.d_model));
  final_layer_norm = register_module("final_layer_norm", MakeLayerNorm(config.d_model));
}

torch::Tensor DecoderLayerImpl::forward(torch::Tensor x, const EncoderOutput& encoder_out,
                                        DecoderState::Layer* cache, torch::Tensor* ffn_in) {
  const bool pre = config_.decoder_normalize_before;
  const bool training = is_training();

  torch::Tensor residual = x;
  if (pre) x = self_attn_layer_norm->forward(x);
  torch::Tensor k = self_attn->ProjectKey(x);
  torch::Tensor v = self_attn->ProjectValue(x);
  if (cache != nullptr) {
    if (cache->self_k.defined()) {
      k = torch::cat({cache->self_k, k}, 2);
      v = torch::cat({cache->self_v, v}, 2);
    }
    cache->self_k = k;
    cache->self_v = v;
  }
  x = self_attn->Attend(x, k, v, torch::Tensor(), /*causal=*/cache == nullptr);
  x = residual + torch::dropout(x, config_.dropout, training);
  if (!pre) x = self_attn_layer_norm->forward(x);

  residual = x;
  if (pre) x = encoder_attn_layer_norm->forward(x);
  if (cache != nullptr) {
    x = AttendSharedEncoder(x, *cache);
  } else {
    x = encoder_attn->Attend(x, encoder_attn->ProjectKey(encoder_out.states),
                             encoder_attn->ProjectValue(encoder_out.states),
                             encoder_out.padding_mask, /*causal=*/false);
  }
  x = residual + torch::dropout(x, config_.dropout, training);
  if (!pre) x = encoder_attn_layer_norm->forward(x);

  return FeedForward(x, ffn_in);
}

// The rows that share an encoder row are that row's queries: [rows, 1, d] is attended as
// [rows / G, G, d], each of the G queries on its own (no mask between them), so the encoder
// keys and values are read once per group instead of once per row.
torch::Tensor DecoderLayerImpl::AttendSharedEncoder(const torch::Tensor& x,
                                                    const DecoderState::Layer& cache) {
  const torch::Tensor queries = x.reshape({cache.enc_k.size(0), -1, x.size(2)});
  return encoder_attn
      ->Attend(queries, cache.enc_k, cache.enc_v, cache.enc_padding_mask, /*causal=*/false)
      .reshape({x.size(0), 1, x.size(2)});
}

torch::Tensor DecoderLayerImpl::FeedForward(torch::Tensor x, torch::Tensor* ffn_in) {
  const bool pre = config_.decoder_normalize_before;
  const bool training = is_training();
  torch::Tensor residual = x;
  if (pre) x = final_layer_norm->forward(x);
  if (ffn_in != nullptr) *ffn_in = x;
  x = torch::dropout(Activation(fc1->forward(x), config_.activation), config_.activation_dropout,
                     training);
  x = residual + torch::dropout(fc2->forward(x), config_.dropout, training);
  if (!pre) x = final_layer_norm->forward(x);
  return x;
}

// ---------------------------------------------------------------------------------------------
TransformerEncoderImpl::TransformerEncoderImpl(const TransformerConfig& config, nn::Embedding embed)
    : config_(config) {
  const int64_t num_positions = config.max_source_positions + config.pad_id + 1;
  embed_tokens = register_module("embed_tokens", std::move(embed));
  if (config.learned_positions) {
    embed_positions = register_module("embed_positions",
                                      MakeEmbedding(num_positions, config.d_model, config.pad_id));
  } else {
    sinusoidal_ = SinusoidalTable(num_positions, config.d_model, config.pad_id);
  }
  if (config.layernorm_embedding) {
    layernorm_embedding = register_module("layernorm_embedding", MakeLayerNorm(config.d_model));
  }
  layers = register_module("layers", nn::ModuleList());
  for (int64_t i = 0; i < config.encoder_layers; ++i) layers->push_back(EncoderLayer(config));
  if (config.encoder_normalize_before) {
    layer_norm = register_module("layer_norm", MakeLayerNorm(config.d_model));
  }
}

EncoderOutput TransformerEncoderImpl::forward(const torch::Tensor& src_tokens) {
  torch::Tensor padding_mask = src_tokens.eq(config_.pad_id);
  torch::Tensor x =
      EmbedWithPositions(config_, embed_tokens, embed_positions, sinusoidal_, layernorm_embedding,
                         src_tokens, MakePositions(src_tokens, config_.pad_id), is_training());
  x = x.masked_fill(padding_mask.unsqueeze(-1), 0.0);  // as fairseq: padding rows are zero
  for (const auto& layer : *layers) x = layer->as<EncoderLayer>()->forward(x, padding_mask);
  if (layer_norm) x = layer_norm->forward(x);
  return {x, padding_mask};
}

// ---------------------------------------------------------------------------------------------
TransformerDecoderImpl::TransformerDecoderImpl(const TransformerConfig& config, nn::Embedding embed)
    : config_(config) {
  const int64_t num_positions = config.max_target_positions + config.pad_id + 1;
  embed_tokens = register_module("embed_tokens", std::move(embed));
  if (config.learned_positions) {
    embed_positions = register_module("embed_positions",
                                      MakeEmbedding(num_positions, config.d_model, config.pad_id));
  } else {
    sinusoidal_ = SinusoidalTable(num_positions, config.d_model, config.pad_id);
  }
  if (config.layernorm_embedding) {
    layernorm_embedding = register_module("layernorm_embedding", MakeLayerNorm(config.d_model));
  }
  layers = register_module("layers", nn::ModuleList());
  for (int64_t i = 0; i < config.decoder_layers; ++i) layers->push_back(DecoderLayer(config));
  if (config.decoder_normalize_before) {
    layer_norm = register_module("layer_norm", MakeLayerNorm(config.d_model));
  }
  if (!config.share_decoder_input_output_embed) {
    output_projection = register_module(
        "output_projection", MakeLinear(config.d_model, config.tgt_vocab_size, /*bias=*/false));
    torch::NoGradGuard no_grad;
    nn::init::normal_(output_projection->weight, 0.0,
                      std::pow(static_cast<double>(config.d_model), -0.5));
  }
}

torch::Tensor TransformerDecoderImpl::Embed(const torch::Tensor& tokens,
                                            const torch::Tensor& positions) {
  return EmbedWithPositions(config_, embed_tokens, embed_positions, sinusoidal_,
                            layernorm_embedding, tokens, positions, is_training());
}

DecoderOutput TransformerDecoderImpl::forward(const torch::Tensor& prev_tokens,
                                              const EncoderOutput& encoder_out, bool with_logits) {
  return Run(Embed(prev_tokens, MakePositions(prev_tokens, config_.pad_id)), encoder_out, nullptr,
             with_logits);
}

DecoderState TransformerDecoderImpl::InitState(const EncoderOutput& encoder_out) {
  DecoderState state;
  for (const auto& module : *layers) {
    auto layer = module->as<DecoderLayer>();
    DecoderState::Layer cache;
    cache.enc_k = layer->encoder_attn->ProjectKey(encoder_out.states);
    cache.enc_v = layer->encoder_attn->ProjectValue(encoder_out.states);
    cache.enc_padding_mask = encoder_out.padding_mask;
    state.layers.push_back(std::move(cache));
  }
  return state;
}

DecoderOutput TransformerDecoderImpl::Step(const torch::Tensor& tokens,
                                           const EncoderOutput& encoder_out, DecoderState& state,
                                           bool with_logits) {
  torch::Tensor positions = torch::full({tokens.size(0), 1}, config_.pad_id + 1 + state.step,
                                        torch::dtype(torch::kLong).device(tokens.device()));
  DecoderOutput out = Run(Embed(tokens.view({-1, 1}), positions), encoder_out, &state, with_logits);
  ++state.step;
  return out;
}

DecoderOutput TransformerDecoderImpl::Run(torch::Tensor x, const EncoderOutput& encoder_out,
                                          DecoderState* state, bool with_logits) {
  DecoderOutput out;
  const size_t num_layers = layers->size();
  for (size_t i = 0; i < num_layers; ++i) {
    DecoderState::Layer* cache = state != nullptr ? &state->layers[i] : nullptr;
    x = layers[i]->as<DecoderLayer>()->forward(x, encoder_out, cache,
                                               i + 1 == num_layers ? &out.ffn_in : nullptr);
  }
  if (layer_norm) x = layer_norm->forward(x);
  out.features = x;
  if (!with_logits) return out;
  out.logits = Logits(x);
  return out;
}

torch::Tensor TransformerDecoderImpl::Logits(const torch::Tensor& features) {
  return output_projection ? output_projection->forward(features)
                           : torch::linear(features, embed_tokens->weight);
}

// ---------------------------------------------------------------------------------------------
TransformerModelImpl::TransformerModelImpl(const TransformerConfig& config) : config_(config) {
  nn::Embedding src_embed = MakeEmbedding(config.src_vocab_size, config.d_model, config.pad_id);
  nn::Embedding tgt_embed =
      config.share_all_embeddings
          ? src_embed
          : MakeEmbedding(config.tgt_vocab_size, config.d_model, config.pad_id);
  encoder = register_module("encoder", TransformerEncoder(config, src_embed));
  decoder = register_module("decoder", TransformerDecoder(config, tgt_embed));
}

std::vector<std::pair<std::string, torch::Tensor>> TransformerModelImpl::UniqueNamedParameters()
    const {
  std::vector<std::pair<std::string, torch::Tensor>> unique;
  std::unordered_set<const void*> seen;
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      unique.emplace_back(item.key(), item.value());
    }
  }
  return unique;
}

torch::Tensor AverageEncoderStates(const EncoderOutput& encoder_out) {
  // Summed in float32 whatever the model's dtype: a half-precision sum over long sentences
  // would lose the digits that separate near neighbours.
  const torch::Tensor keep = encoder_out.padding_mask.logical_not().to(torch::kFloat);  // [B, L]
  const torch::Tensor states = encoder_out.states.to(torch::kFloat);                    // [B, L, d]
  const torch::Tensor sum = (states * keep.unsqueeze(-1)).sum(1);
  const torch::Tensor count = keep.sum(1, /*keepdim=*/true).clamp_min(1);
  return (sum / count).to(torch::kCPU).contiguous();
}

void ReorderDecoderState(DecoderState& state, const torch::Tensor& index) {
  // With G > 1 the same index would pick encoder rows by decoder row numbers: wrong sentences,
  // or an index_select out of range, far from the caller that broke the contract.
  for (const DecoderState::Layer& layer : state.layers) {
    KNNSERVE_CHECK(!layer.self_k.defined() || !layer.enc_k.defined() ||
                       layer.self_k.size(0) == layer.enc_k.size(0),
                   "ReorderDecoderState REQUIRES one decoder row per encoder row");
  }
  ReorderSelfAttentionState(state, index);
  SelectEncoderStates(state, index);
}

void SelectEncoderStates(DecoderState& state, const torch::Tensor& index) {
  for (DecoderState::Layer& layer : state.layers) {
    for (torch::Tensor* t : {&layer.enc_k, &layer.enc_v, &layer.enc_padding_mask}) {
      if (t->defined()) *t = t->index_select(0, index);
    }
  }
}

void ReorderSelfAttentionState(DecoderState& state, const torch::Tensor& index) {
  for (DecoderState::Layer& layer : state.layers) {
    for (torch::Tensor* t : {&layer.self_k, &layer.self_v}) {
      if (t->defined()) *t = t->index_select(0, index);
    }
  }
}

}  // namespace knnserve::model
