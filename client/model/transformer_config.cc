#include "client/model/transformer_config.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace knnserve::model {
namespace {

// One list of fields serves both directions.
template <typename Json, typename Config, typename Fn>
void ForEachField(Json& json, Config& c, Fn fn) {
  fn(json, "src_vocab_size", c.src_vocab_size);
  fn(json, "tgt_vocab_size", c.tgt_vocab_size);
  fn(json, "pad_id", c.pad_id);
  fn(json, "eos_id", c.eos_id);
  fn(json, "d_model", c.d_model);
  fn(json, "encoder_layers", c.encoder_layers);
  fn(json, "decoder_layers", c.decoder_layers);
  fn(json, "encoder_heads", c.encoder_heads);
  fn(json, "decoder_heads", c.decoder_heads);
  fn(json, "encoder_ffn_dim", c.encoder_ffn_dim);
  fn(json, "decoder_ffn_dim", c.decoder_ffn_dim);
  fn(json, "encoder_normalize_before", c.encoder_normalize_before);
  fn(json, "decoder_normalize_before", c.decoder_normalize_before);
  fn(json, "learned_positions", c.learned_positions);
  fn(json, "max_source_positions", c.max_source_positions);
  fn(json, "max_target_positions", c.max_target_positions);
  fn(json, "share_all_embeddings", c.share_all_embeddings);
  fn(json, "share_decoder_input_output_embed", c.share_decoder_input_output_embed);
  fn(json, "no_scale_embedding", c.no_scale_embedding);
  fn(json, "layernorm_embedding", c.layernorm_embedding);
  fn(json, "activation", c.activation);
  fn(json, "dropout", c.dropout);
  fn(json, "attention_dropout", c.attention_dropout);
  fn(json, "activation_dropout", c.activation_dropout);
}

}  // namespace

absl::Status TransformerConfig::Validate() const {
  auto positive = [](const char* name, int64_t value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("model config: ", name, " must be > 0, got ",
                                                   value));
  };
  for (const auto& [name, value] :
       {std::pair<const char*, int64_t>{"src_vocab_size", src_vocab_size},
        {"tgt_vocab_size", tgt_vocab_size}, {"d_model", d_model},
        {"encoder_layers", encoder_layers}, {"decoder_layers", decoder_layers},
        {"encoder_heads", encoder_heads}, {"decoder_heads", decoder_heads},
        {"encoder_ffn_dim", encoder_ffn_dim}, {"decoder_ffn_dim", decoder_ffn_dim},
        {"max_source_positions", max_source_positions},
        {"max_target_positions", max_target_positions}}) {
    if (absl::Status s = positive(name, value); !s.ok()) return s;
  }
  if (d_model % encoder_heads != 0 || d_model % decoder_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model config: d_model ", d_model,
                                                   " must be divisible by the head counts (",
                                                   encoder_heads, ", ", decoder_heads, ")"));
  }
  if (share_all_embeddings && src_vocab_size != tgt_vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: share_all_embeddings needs equal vocabularies, got ", src_vocab_size,
        " and ", tgt_vocab_size));
  }
  if (pad_id < 0 || pad_id >= tgt_vocab_size || eos_id < 0 || eos_id >= tgt_vocab_size) {
    return absl::InvalidArgumentError("model config: pad_id/eos_id outside the vocabulary");
  }
  if (activation != "relu" && activation != "gelu") {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: activation must be relu or gelu, got ", activation));
  }
  return absl::OkStatus();
}

std::string TransformerConfig::ToJson() const {
  nlohmann::json json;
  TransformerConfig copy = *this;
  ForEachField(json, copy, [](nlohmann::json& j, const char* name, auto& value) {
    j[name] = value;
  });
  return json.dump(2);
}

absl::StatusOr<TransformerConfig> TransformerConfig::FromJson(const std::string& text) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("model config is not a JSON object");
  }
  TransformerConfig config;
  std::string error;
  ForEachField(json, config, [&error](nlohmann::json& j, const char* name, auto& value) {
    if (!j.contains(name)) return;  // keeps the default
    try {
      j.at(name).get_to(value);
    } catch (const nlohmann::json::exception& e) {
      if (error.empty()) error = absl::StrCat("model config field '", name, "': ", e.what());
    }
  });
  if (!error.empty()) return absl::InvalidArgumentError(error);
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  return config;
}

}  // namespace knnserve::model
