#include "common/index/subset_device.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/adc/subset_adc.h"
#include "common/status_macros.h"
#ifdef KNNSERVE_WITH_CUDA
#include "common/adc/cuda/cuda_subset_adc.h"
#endif

namespace knnserve {

absl::Status UseSubsetDevice(absl::string_view device, IndexEngineOptions& options) {
  if (device == "cpu") {
    options.subset_searcher = nullptr;
    return absl::OkStatus();
  }
  if (device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("subset device \"", device, "\": expected cpu or cuda"));
  }
#ifdef KNNSERVE_WITH_CUDA
  options.subset_searcher = [](std::shared_ptr<const SubsetAdc> cpu)
      -> absl::StatusOr<std::unique_ptr<const SubsetSearcher>> {
    ASSIGN_OR_RETURN(std::unique_ptr<CudaSubsetAdc> gpu, CudaSubsetAdc::Create(std::move(cpu)));
    return gpu;
  };
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      "subset device cuda: this build has no CUDA support (configure with "
      "-DKNNSERVE_WITH_CUDA=ON)");
#endif
}

}  // namespace knnserve
