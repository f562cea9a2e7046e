// CudaSubsetAdc: the GPU twin of SubsetAdc (common/adc/subset_adc.h): same contract, same
// distances bit for bit (the kernel sums in the CPU kernels' canonical order), over the codes
// copied to the current CUDA device. The CPU engine it is made from builds the LUTs and stays
// the reference. Built only with -DKNNSERVE_WITH_CUDA=ON.
//
// STATUS: compiled for sm_90, NOT YET RUN ON A GPU (none was available where it was written).
// Before use, check it against SubsetAdc on a GPU machine (same ids and distances).
//
// Thread-safety: SearchSubset is const and allocates its own device buffers per call.
#ifndef KNNSERVE_COMMON_ADC_CUDA_CUDA_SUBSET_ADC_H_
#define KNNSERVE_COMMON_ADC_CUDA_CUDA_SUBSET_ADC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/adc/subset_adc.h"

namespace knnserve {

class CudaSubsetAdc {
 public:
  static absl::StatusOr<std::unique_ptr<CudaSubsetAdc>> Create(
      std::shared_ptr<const SubsetAdc> cpu);
  ~CudaSubsetAdc();
  CudaSubsetAdc(const CudaSubsetAdc&) = delete;
  CudaSubsetAdc& operator=(const CudaSubsetAdc&) = delete;

  // As SubsetAdc::SearchSubset.
  absl::StatusOr<SubsetResult> SearchSubset(MatrixView<const float> queries,
                                            const SubsetGroups& groups,
                                            absl::Span<const int32_t> row_group, int k) const;

 private:
  CudaSubsetAdc(std::shared_ptr<const SubsetAdc> cpu, void* device_codes);

  const std::shared_ptr<const SubsetAdc> cpu_;
  void* const device_codes_;  // codes of cpu_->codes(), owned
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_ADC_CUDA_CUDA_SUBSET_ADC_H_
