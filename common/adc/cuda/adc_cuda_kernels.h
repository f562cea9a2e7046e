// Plain C++ interface to the CUDA subset-ADC kernels (no CUDA or absl types), so that host code
// compiled by the C++ compiler can call them. Built only with KNNSERVE_WITH_CUDA. Functions
// returning std::string return "" on success, else the CUDA error text.
#ifndef KNNSERVE_COMMON_ADC_CUDA_ADC_CUDA_KERNELS_H_
#define KNNSERVE_COMMON_ADC_CUDA_ADC_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace knnserve::cuda {

// CUDA devices this process can use (0 when there is no driver or no device).
int DeviceCount();
// "name, N SMs, X GiB" of the current device, for logs and benchmark tables.
std::string DeviceDescription();

// A buffer on the current device, freed on destruction. Thread-compatible.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Replaces the contents with a copy of `bytes` bytes at `host`.
  std::string Upload(const void* host, size_t bytes);
  const void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// A codebook and its codes resident on the device (device pointers).
struct DeviceCodes {
  int m_count = 0;                     // code bytes per vector, 1 .. 256
  int dsub = 0;                        // dimensions per sub-quantizer
  const uint8_t* codes = nullptr;      // vectors x m_count
  const float* centroids_t = nullptr;  // m_count x dsub x 256 (TransposeCentroids' layout)
};

// One batch of subset searches. All arrays are host memory.
//
// The groups' positions are numbered group after group: group g's are
// group_position[g] .. group_position[g + 1] − 1, and the ranges cover them in order, range r's
// positions range_start[r] .. range_start[r + 1] − 1 (starts strictly ascending, from 0 to the
// total) holding the local tokens range_begin[r], range_begin[r] + 1, ... A group's tokens are
// ascending. Query q searches the positions of group query_group[q].
struct SubsetScan {
  bool inner_product = false;  // rank by descending inner product (else ascending squared L2)
  int k = 0;                   // neighbours per query, >= 1
  int num_queries = 0;
  const float* queries = nullptr;        // num_queries x (m_count * dsub), transformed
  const int32_t* query_group = nullptr;  // num_queries
  int num_groups = 0;
  const int64_t* group_position = nullptr;  // num_groups + 1
  int64_t num_ranges = 0;
  const int64_t* range_begin = nullptr;  // num_ranges
  const int64_t* range_start = nullptr;  // num_ranges + 1
};

// For every query, its m_count x 256 table is built on the device with the operations of
// adc_kernels.h's LutScalar (same order, no fused multiply-add: bit-identical tables), and the
// distance of every position is the sum of its code's table entries in the canonical order of
// adc_kernels.h (so bit-identical to the CPU's exact scans, except that a sum of -0.0 is
// returned as +0.0); then each query's positions are ranked (stable: ties keep
// ascending tokens). Writes num_queries x k row-major: the best min(k, total) distances and
// local token ids of each query, in rank order, then id -1 (distance unspecified).
// REQUIRES: codes.codes holds every token the ranges name.
// Thread-safe: each calling thread works on its own per-thread stream and buffers.
std::string SubsetAdcSearch(const DeviceCodes& codes, const SubsetScan& scan, float* distances,
                            int64_t* ids);

}  // namespace knnserve::cuda

#endif  // KNNSERVE_COMMON_ADC_CUDA_ADC_CUDA_KERNELS_H_
