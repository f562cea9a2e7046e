#include "common/adc/cuda/cuda_subset_adc.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/adc/two_stage.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

absl::Status CudaStatus(const std::string& error, absl::string_view what) {
  if (error.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA: ", what, ": ", error));
}

// The token ranges of the groups that some query row uses, in SubsetScan's layout.
struct GroupRanges {
  std::vector<int32_t> query_group;  // per query row, its index among the used groups
  std::vector<int64_t> group_position = {0};
  std::vector<int64_t> begin;
  std::vector<int64_t> start = {0};
};

GroupRanges UsedGroupRanges(const SubsetCodes& codes, const SubsetGroups& groups,
                            absl::Span<const int32_t> row_group) {
  GroupRanges out;
  std::vector<int32_t> used(groups.size(), -1);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int32_t g : row_group) {
    if (used[g] < 0) {
      used[g] = static_cast<int32_t>(out.group_position.size()) - 1;
      SubsetRanges(codes, groups[g], ranges);
      for (const auto& [begin, end] : ranges) {
        out.begin.push_back(begin);
        out.start.push_back(out.start.back() + end - begin);
      }
      out.group_position.push_back(out.start.back());
    }
    out.query_group.push_back(used[g]);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaSubsetAdc>> CudaSubsetAdc::Create(
    std::shared_ptr<const SubsetAdc> cpu) {
  if (cuda::DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  auto gpu = std::unique_ptr<CudaSubsetAdc>(new CudaSubsetAdc(std::move(cpu)));
  const std::vector<uint8_t>& codes = gpu->cpu_->codes().codes;
  RETURN_IF_ERROR(
      CudaStatus(gpu->codes_.Upload(codes.data(), codes.size()), "copy the subset codes"));
  const auto centroids_t = adc_internal::TransposeCentroids(gpu->cpu_->codebook());
  RETURN_IF_ERROR(
      CudaStatus(gpu->centroids_t_.Upload(centroids_t.data(), centroids_t.size() * sizeof(float)),
                 "copy the PQ centroids"));
  return gpu;
}

absl::StatusOr<SubsetResult> CudaSubsetAdc::SearchSubset(
    MatrixView<const float> queries, const std::shared_ptr<const SubsetGroups>& shared_groups,
    absl::Span<const int32_t> row_group, int k) const {
  const SubsetGroups& groups = *shared_groups;
  const PqCodebook& codebook = cpu_->codebook();
  RETURN_IF_ERROR(CheckSubsetSearch(codebook.dim(), queries, groups, row_group, k));
  const GroupRanges ranges = UsedGroupRanges(cpu_->codes(), groups, row_group);
  cuda::SubsetScan scan;
  scan.inner_product = cpu_->metric() == Metric::kInnerProduct;
  scan.k = k;
  scan.num_queries = static_cast<int>(queries.rows);
  scan.queries = queries.data;
  scan.query_group = ranges.query_group.data();
  scan.num_groups = static_cast<int>(ranges.group_position.size()) - 1;
  scan.group_position = ranges.group_position.data();
  scan.num_ranges = static_cast<int64_t>(ranges.begin.size());
  scan.range_begin = ranges.begin.data();
  scan.range_start = ranges.start.data();
  const cuda::DeviceCodes device{codebook.m, codebook.dsub,
                                 static_cast<const uint8_t*>(codes_.get()),
                                 static_cast<const float*>(centroids_t_.get())};

  SubsetResult result;
  result.neighbors = Neighbors::Missing(queries.rows, k, cpu_->metric(), /*with_values=*/false);
  std::vector<float> distances(queries.rows * k);
  std::vector<int64_t> ids(queries.rows * k);
  RETURN_IF_ERROR(CudaStatus(cuda::SubsetAdcSearch(device, scan, distances.data(), ids.data()),
                             "subset ADC search"));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) continue;
    result.neighbors.distances[i] = distances[i];
    result.neighbors.ids[i] = cpu_->codes().token_begin + ids[i];
  }
  result.vectors_scanned = ranges.group_position.back();
  return result;
}

}  // namespace knnserve
