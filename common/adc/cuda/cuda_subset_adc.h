// CudaSubsetAdc: the GPU twin of SubsetAdc (common/adc/subset_adc.h): same contract and the
// same answers (ids, and distances bit for bit: tables and sums follow the CPU's exact kernels'
// operation order), over the codes and codebook copied to the current CUDA device at Create.
// Built only with -DKNNSERVE_WITH_CUDA=ON; adc_cuda_test checks it against SubsetAdc.
//
// Thread-safety: immutable after Create; SearchSubset is const and safe from many threads
// (each thread's calls run on its own CUDA stream).
#ifndef KNNSERVE_COMMON_ADC_CUDA_CUDA_SUBSET_ADC_H_
#define KNNSERVE_COMMON_ADC_CUDA_CUDA_SUBSET_ADC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/adc/cuda/adc_cuda_kernels.h"
#include "common/adc/subset_adc.h"

namespace knnserve {

class CudaSubsetAdc : public SubsetSearcher {
 public:
  // Fails when there is no CUDA device or the codes do not fit its memory.
  static absl::StatusOr<std::unique_ptr<CudaSubsetAdc>> Create(
      std::shared_ptr<const SubsetAdc> cpu);

  // As SubsetAdc::SearchSubset.
  absl::StatusOr<SubsetResult> SearchSubset(MatrixView<const float> queries,
                                            const std::shared_ptr<const SubsetGroups>& groups,
                                            absl::Span<const int32_t> row_group,
                                            int k) const override;

  const SubsetAdc& cpu() const { return *cpu_; }

 private:
  explicit CudaSubsetAdc(std::shared_ptr<const SubsetAdc> cpu) : cpu_(std::move(cpu)) {}

  const std::shared_ptr<const SubsetAdc> cpu_;
  cuda::DeviceBuffer codes_;        // cpu_->codes().codes
  cuda::DeviceBuffer centroids_t_;  // m x dsub x 256
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_ADC_CUDA_CUDA_SUBSET_ADC_H_
