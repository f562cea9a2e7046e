// Plain C++ interface to the CUDA subset-ADC kernels (no CUDA or absl types), so that host code
// compiled by the C++ compiler can call them. Built only with KNNSERVE_WITH_CUDA.
// NOT YET RUN ON A GPU: compiled for sm_90 only; needs checking against SubsetAdc on a GPU
// machine before use.
#ifndef KNNSERVE_COMMON_ADC_CUDA_ADC_CUDA_KERNELS_H_
#define KNNSERVE_COMMON_ADC_CUDA_ADC_CUDA_KERNELS_H_

#include <cstdint>
#include <string>

namespace knnserve::cuda {

// Device buffers are raw device pointers. Returns "" on success, else the CUDA error text.
std::string CopyToDevice(const void* host, size_t bytes, void** device);
std::string FreeDevice(void* device);

// For each query q < num_queries and each position p < total of the concatenated token ranges
// [range_begin[r], range_end[r]) (range_prefix[r] = positions before range r, ascending):
//   distances[q * total + p] = Σ_m luts[q][m * 256 + codes[t * m_count + m]], t the token at p,
// summed in the canonical 16-partial order of adc_kernels.h (bit-identical to the CPU kernels);
//   ids[q * total + p] = t.
// Then sorts each query's row (ascending for L2, descending for inner product; stable, so ties
// keep ascending ids) and copies the first k distances and ids of each row to the host
// (k <= total). All pointers except the outputs are device pointers.
std::string SubsetAdcSearch(const float* luts, int num_queries, const uint8_t* codes, int m_count,
                            const int64_t* range_begin, const int64_t* range_prefix, int num_ranges,
                            int64_t total, bool inner_product, int k, float* host_distances,
                            int64_t* host_ids);

}  // namespace knnserve::cuda

#endif  // KNNSERVE_COMMON_ADC_CUDA_ADC_CUDA_KERNELS_H_
