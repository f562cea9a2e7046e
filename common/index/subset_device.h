// Where subset ADC runs: the CPU engine, or its GPU twin (built with -DKNNSERVE_WITH_CUDA=ON).
#ifndef KNNSERVE_COMMON_INDEX_SUBSET_DEVICE_H_
#define KNNSERVE_COMMON_INDEX_SUBSET_DEVICE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/index/index_engine.h"

namespace knnserve {

// Sets options.subset_searcher for `device`: "cpu" (unset: SubsetAdc) or "cuda" (the codes of
// each engine copied to the current CUDA device and searched by CudaSubsetAdc; the engine's
// Create then fails without a device). "cuda" in a build without CUDA is FailedPrecondition,
// any other name InvalidArgument.
absl::Status UseSubsetDevice(absl::string_view device, IndexEngineOptions& options);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_INDEX_SUBSET_DEVICE_H_
