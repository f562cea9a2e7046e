#include "common/adc/cuda/cuda_subset_adc.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/adc/cuda/adc_cuda_kernels.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

absl::Status CudaStatus(const std::string& error, absl::string_view what) {
  if (error.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA: ", what, ": ", error));
}

// A device copy of a host vector, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cuda::FreeDevice(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T>
  absl::Status Upload(const std::vector<T>& host) {
    return CudaStatus(cuda::CopyToDevice(host.data(), host.size() * sizeof(T), &ptr_), "upload");
  }
  template <typename T>
  const T* get() const {
    return static_cast<const T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaSubsetAdc>> CudaSubsetAdc::Create(
    std::shared_ptr<const SubsetAdc> cpu) {
  const std::vector<uint8_t>& codes = cpu->codes().codes;
  void* device = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cuda::CopyToDevice(codes.data(), codes.size(), &device), "copy subset codes"));
  return std::unique_ptr<CudaSubsetAdc>(new CudaSubsetAdc(std::move(cpu), device));
}

CudaSubsetAdc::CudaSubsetAdc(std::shared_ptr<const SubsetAdc> cpu, void* device_codes)
    : cpu_(std::move(cpu)), device_codes_(device_codes) {}

CudaSubsetAdc::~CudaSubsetAdc() { cuda::FreeDevice(device_codes_); }

absl::StatusOr<SubsetResult> CudaSubsetAdc::SearchSubset(MatrixView<const float> queries,
                                                         const SubsetGroups& groups,
                                                         absl::Span<const int32_t> row_group,
                                                         int k) const {
  const PqCodebook& codebook = cpu_->codebook();
  RETURN_IF_ERROR(CheckSubsetSearch(codebook.dim(), queries, groups, row_group, k));
  SubsetResult result;
  result.neighbors = Neighbors::Missing(queries.rows, k, cpu_->metric(), /*with_values=*/false);
  const size_t lut_floats = static_cast<size_t>(codebook.m) * PqCodebook::kCentroids;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < queries.rows; ++r) {
      if (row_group[r] == static_cast<int32_t>(g)) rows.push_back(r);
    }
    if (rows.empty()) continue;
    SubsetRanges(cpu_->codes(), groups[g], ranges);
    std::vector<int64_t> begins, prefix;
    int64_t total = 0;
    for (const auto& [begin, end] : ranges) {
      begins.push_back(begin);
      prefix.push_back(total);
      total += end - begin;
    }
    result.vectors_scanned += total;
    if (total == 0) continue;
    std::vector<float> luts(rows.size() * lut_floats);
    for (size_t q = 0; q < rows.size(); ++q) {
      cpu_->ComputeLut(queries.row(rows[q]), luts.data() + q * lut_floats);
    }
    DeviceBuffer device_luts, device_begins, device_prefix;
    RETURN_IF_ERROR(device_luts.Upload(luts));
    RETURN_IF_ERROR(device_begins.Upload(begins));
    RETURN_IF_ERROR(device_prefix.Upload(prefix));
    const int kept = static_cast<int>(std::min<int64_t>(k, total));
    std::vector<float> distances(rows.size() * kept);
    std::vector<int64_t> ids(rows.size() * kept);
    RETURN_IF_ERROR(CudaStatus(
        cuda::SubsetAdcSearch(
            device_luts.get<float>(), static_cast<int>(rows.size()),
            static_cast<const uint8_t*>(device_codes_), codebook.m, device_begins.get<int64_t>(),
            device_prefix.get<int64_t>(), static_cast<int>(ranges.size()), total,
            cpu_->metric() == Metric::kInnerProduct, kept, distances.data(), ids.data()),
        "subset ADC search"));
    for (size_t q = 0; q < rows.size(); ++q) {
      for (int j = 0; j < kept; ++j) {
        result.neighbors.distances[rows[q] * k + j] = distances[q * kept + j];
        result.neighbors.ids[rows[q] * k + j] = cpu_->codes().token_begin + ids[q * kept + j];
      }
    }
  }
  return result;
}

}  // namespace knnserve
