#include "client/knn/provenance.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/decode/search.h"
#include "common/datastore/values_file.h"
#include "common/status_macros.h"

namespace knnserve::knn {

absl::StatusOr<std::unique_ptr<ProvenancePrinter>> ProvenancePrinter::Create(
    const std::string& values_path) {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lines;
  if (!values_path.empty()) {
    // Only the sentence offsets and corpus lines are needed: the tokens stay on disk.
    ASSIGN_OR_RETURN(const std::unique_ptr<ValuesReader> values, ValuesReader::Open(values_path));
    offsets = values->offsets(ValuesSide::kTarget);
    lines = values->order();
  }
  return absl::WrapUnique(new ProvenancePrinter(std::move(offsets), std::move(lines)));
}

absl::StatusOr<std::string> ProvenancePrinter::Explain(
    model::TransformerModel& model, const Tokenizer& tokenizer, const std::string& source,
    const std::string& hypothesis, KnnLogitsProcessor& processor, int print_k) const {
  const model::TransformerConfig& config = model->config();
  ASSIGN_OR_RETURN(torch::Tensor src,
                   decode::EncodeSources(tokenizer, {source}, config.max_source_positions,
                                         config.pad_id, config.eos_id));
  ASSIGN_OR_RETURN(std::vector<int> target, tokenizer.Encode(hypothesis));
  if (static_cast<int64_t>(target.size()) >= config.max_target_positions) {
    target.resize(config.max_target_positions - 1);
  }
  target.push_back(static_cast<int>(config.eos_id));
  std::vector<int64_t> prev = {config.eos_id};  // fairseq: the decoder input starts with EOS
  prev.insert(prev.end(), target.begin(), target.end() - 1);
  torch::Tensor features;
  try {
    torch::NoGradGuard no_grad;
    model::EncoderOutput encoded = model->Encode(src);
    features =
        model
            ->Decode(torch::tensor(prev, torch::kLong).unsqueeze(0), encoded, /*with_logits=*/false)
            .features.squeeze(0);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("provenance pass failed: ", e.what_without_backtrace()));
  }
  ASSIGN_OR_RETURN(Neighbors neighbors, processor.SearchOnce(features));
  std::string text;
  const int shown = std::min(print_k, neighbors.k);
  for (size_t t = 0; t < target.size(); ++t) {
    absl::StrAppend(&text, t, "\t", tokenizer.IdToPiece(target[t]));
    for (int j = 0; j < shown; ++j) {
      const int64_t i = static_cast<int64_t>(t) * neighbors.k + j;
      const int64_t id = neighbors.ids[i];
      if (id < 0) break;
      std::string where = absl::StrCat("id=", id);
      if (!offsets_.empty()) {
        const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), id);
        const int64_t sentence = (it - offsets_.begin()) - 1;
        // The stored sentence (the id subset searches name) and its corpus line, 1-based.
        where = absl::StrCat("s=", sentence, " line=", lines_[sentence] + 1, ":",
                             id - offsets_[sentence]);
      }
      absl::StrAppendFormat(&text, "\t[%s %s d=%.3g]", where,
                            tokenizer.IdToPiece(neighbors.values[i]), neighbors.distances[i]);
    }
    absl::StrAppend(&text, "\n");
  }
  return text;
}

}  // namespace knnserve::knn
