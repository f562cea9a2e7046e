#include "client/knn/subset_selector.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/index/index_engine.h"
#include "common/status_macros.h"
#include "common/wire.h"

namespace knnserve::knn {

absl::StatusOr<std::unique_ptr<SentenceIndexSelector>> SentenceIndexSelector::Create(
    std::unique_ptr<SearchEngine> index, int n) {
  if (n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--subset-sentences must be >= 1, got ", n));
  }
  if (n > RequestLimits().max_k) {
    return absl::InvalidArgumentError(
        absl::StrCat("--subset-sentences must be <= ", RequestLimits().max_k, ", got ", n));
  }
  if (index->info().total_vectors == 0) {
    return absl::FailedPreconditionError("the sentence index is empty");
  }
  return absl::WrapUnique(new SentenceIndexSelector(std::move(index), n));
}

absl::StatusOr<std::unique_ptr<SentenceIndexSelector>> SentenceIndexSelector::Load(
    const std::string& dir, int n, int threads) {
  IndexEngineOptions options;
  options.threads = threads;
  absl::StatusOr<std::unique_ptr<SearchEngine>> index = CreateLocalEngine(dir, options);
  if (!index.ok()) {
    return absl::Status(index.status().code(),
                        absl::StrCat("sentence index ", dir, ": ", index.status().message()));
  }
  return Create(*std::move(index), n);
}

absl::StatusOr<SubsetGroups> SentenceIndexSelector::Select(
    const torch::Tensor& /*src_tokens*/, const model::EncoderOutput& encoder_out) {
  const torch::Tensor embeddings = model::AverageEncoderStates(encoder_out);
  const EngineInfo& info = index_->info();
  if (embeddings.size(1) != info.dim) {
    return absl::FailedPreconditionError(
        absl::StrCat("sentence embeddings have ", embeddings.size(1), " dims, the sentence index ",
                     info.dim, ": was it built with this model?"));
  }
  v1::SearchRequest request;
  SearchParams params;
  params.k = static_cast<int>(std::min<int64_t>(n_, info.total_vectors));
  EncodeSearchRequest({embeddings.data_ptr<float>(), embeddings.size(0), embeddings.size(1)},
                      v1::DTYPE_FP32, params, &request);
  ASSIGN_OR_RETURN(SearchQuery query, ParseSearchRequest(request, {info.dim, 0}, limits_));
  ASSIGN_OR_RETURN(EngineResult nearest, index_->Search(query));
  const Neighbors& n = nearest.neighbors;
  SubsetGroups groups(n.rows);
  for (int64_t r = 0; r < n.rows; ++r) {
    const int64_t* ids = n.id_row(r);
    for (int j = 0; j < n.k; ++j) {
      if (ids[j] >= 0) groups[r].push_back(ids[j]);
    }
  }
  return groups;
}

}  // namespace knnserve::knn
