// The reference transformer as a FeatureExtractor. LibTorch exceptions stop here.
#include "client/datastore/feature_extractor.h"

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <optional>

#include "absl/strings/str_cat.h"
#include "client/model/checkpoint.h"
#include "common/status_macros.h"

namespace knnserve::datastore {
namespace {

// Catches LibTorch's exceptions (shape errors, out of memory) and returns them as Status.
template <typename Body>
auto GuardTorch(absl::string_view what, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {  // its what() carries a C++ stack trace
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

// rows [batch, longest] int64, right-padded with `pad`; `shift_eos` puts EOS first and drops the
// last token of each row (the teacher-forced decoder input).
torch::Tensor PadRows(const std::vector<absl::Span<const int32_t>>& rows, int64_t pad,
                      bool shift_eos, int64_t eos) {
  int64_t longest = 0;
  for (const auto& r : rows) longest = std::max<int64_t>(longest, static_cast<int64_t>(r.size()));
  torch::Tensor out = torch::full({static_cast<int64_t>(rows.size()), longest}, pad, torch::kLong);
  auto a = out.accessor<int64_t, 2>();
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (shift_eos) {
      if (!r.empty()) a[i][0] = eos;
      for (size_t j = 1; j < r.size(); ++j) a[i][j] = r[j - 1];
    } else {
      for (size_t j = 0; j < r.size(); ++j) a[i][j] = r[j];
    }
  }
  return out;
}

class TransformerExtractor : public FeatureExtractor {
 public:
  TransformerExtractor(model::TransformerModel model, bool ffn_in, torch::Device device)
      : model_(std::move(model)), config_(model_->config()), ffn_in_(ffn_in), device_(device) {}

  int dim() const override { return static_cast<int>(config_.d_model); }
  int64_t max_source_length() const override { return config_.max_source_positions; }
  int64_t max_target_length() const override { return config_.max_target_positions; }

  absl::StatusOr<Matrix<float>> TokenFeatures(const SentenceBatch& batch) override {
    return GuardTorch("token features", [&]() -> absl::StatusOr<Matrix<float>> {
      torch::NoGradGuard no_grad;
      model::EncoderOutput encoded = model_->Encode(Source(batch));
      torch::Tensor prev =
          PadRows(batch.targets, config_.pad_id, /*shift_eos=*/true, config_.eos_id).to(device_);
      model::DecoderOutput decoded = model_->Decode(prev, encoded, /*with_logits=*/false);
      torch::Tensor features =
          (ffn_in_ ? decoded.ffn_in : decoded.features).to(torch::kCPU, torch::kFloat).contiguous();
      int64_t rows = 0;
      for (const auto& t : batch.targets) rows += static_cast<int64_t>(t.size());
      Matrix<float> out(rows, config_.d_model);
      const int64_t d = config_.d_model;
      const int64_t len = features.size(1);
      const float* src = features.data_ptr<float>();
      int64_t row = 0;
      for (size_t i = 0; i < batch.targets.size(); ++i) {
        const int64_t n = static_cast<int64_t>(batch.targets[i].size());
        std::copy(src + static_cast<int64_t>(i) * len * d,
                  src + (static_cast<int64_t>(i) * len + n) * d, out.row(row));
        row += n;
      }
      return out;
    });
  }

  absl::StatusOr<Matrix<float>> SentenceEmbeddings(const SentenceBatch& batch) override {
    return GuardTorch("sentence embeddings", [&]() -> absl::StatusOr<Matrix<float>> {
      torch::NoGradGuard no_grad;
      model::EncoderOutput encoded = model_->Encode(Source(batch));
      const torch::Tensor mean = model::AverageEncoderStates(encoded);
      std::vector<float> data(mean.data_ptr<float>(), mean.data_ptr<float>() + mean.numel());
      return Matrix<float>(mean.size(0), mean.size(1), std::move(data));
    });
  }

 private:
  torch::Tensor Source(const SentenceBatch& batch) const {
    return PadRows(batch.sources, config_.pad_id, /*shift_eos=*/false, config_.eos_id).to(device_);
  }

  model::TransformerModel model_;
  const model::TransformerConfig config_;
  const bool ffn_in_;
  const torch::Device device_;
};

}  // namespace

absl::StatusOr<LoadedExtractor> LoadTransformerExtractor(const std::string& checkpoint_path,
                                                         const std::string& feature,
                                                         const std::string& device) {
  if (feature != kFeatureDecoderOut && feature != kFeatureFfnIn) {
    return absl::InvalidArgumentError(absl::StrCat("unknown feature \"", feature, "\" (use ",
                                                   kFeatureDecoderOut, " or ", kFeatureFfnIn, ")"));
  }
  ASSIGN_OR_RETURN(model::LoadedModel loaded, model::LoadCheckpoint(checkpoint_path));
  std::optional<torch::Device> parsed;
  try {
    parsed.emplace(device);
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", device, "\" is not a device (cpu, cuda or cuda:N)"));
  }
  return GuardTorch("load model", [&]() -> absl::StatusOr<LoadedExtractor> {
    const torch::Device torch_device = *parsed;
    if (torch_device.is_cuda() && !torch::cuda::is_available()) {
      return absl::FailedPreconditionError(
          absl::StrCat("device ", device, " requested but CUDA is not available"));
    }
    loaded.model->to(torch_device);
    loaded.model->eval();
    LoadedExtractor out;
    const model::TransformerConfig& config = loaded.model->config();
    out.vocab_size = config.tgt_vocab_size;
    out.pad_id = config.pad_id;
    out.eos_id = config.eos_id;
    out.tokenizer = std::move(loaded.tokenizer);
    out.extractor = std::make_unique<TransformerExtractor>(loaded.model, feature == kFeatureFfnIn,
                                                           torch_device);
    return out;
  });
}

}  // namespace knnserve::datastore
