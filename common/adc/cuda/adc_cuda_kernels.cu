// CUDA subset ADC (see adc_cuda_kernels.h). One thread per (query, position): it finds its token
// by binary search over the range prefix sums, then sums the LUT entries of the token's code in
// the canonical order of the CPU kernels. k-selection sorts each query's row with thrust.
// NOT YET RUN ON A GPU (no GPU where this was written): compile-checked for sm_90 only.
#include <cuda_runtime.h>
#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/sort.h>

#include "common/adc/cuda/adc_cuda_kernels.h"

namespace knnserve::cuda {
namespace {

std::string ErrorText(cudaError_t e) { return e == cudaSuccess ? "" : cudaGetErrorString(e); }

__global__ void AdcDistancesKernel(const float* __restrict__ luts, int num_queries,
                                   const uint8_t* __restrict__ codes, int m_count,
                                   const int64_t* __restrict__ range_begin,
                                   const int64_t* __restrict__ range_prefix, int num_ranges,
                                   int64_t total, float* __restrict__ distances,
                                   int64_t* __restrict__ ids) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int q = blockIdx.y;
  if (p >= total || q >= num_queries) return;
  // Last range whose prefix is <= p.
  int lo = 0, hi = num_ranges - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (range_prefix[mid] <= p) lo = mid; else hi = mid - 1;
  }
  const int64_t token = range_begin[lo] + (p - range_prefix[lo]);
  const uint8_t* code = codes + token * m_count;
  const float* lut = luts + static_cast<int64_t>(q) * m_count * 256;
  float acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = 0.0f;
  for (int m = 0; m < m_count; ++m) acc[m % 16] = __fadd_rn(acc[m % 16], lut[m * 256 + code[m]]);
  for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], acc[j + 8]);
  for (int j = 0; j < 4; ++j) acc[j] = __fadd_rn(acc[j], acc[j + 4]);
  for (int j = 0; j < 2; ++j) acc[j] = __fadd_rn(acc[j], acc[j + 2]);
  distances[q * total + p] = __fadd_rn(acc[0], acc[1]);
  ids[q * total + p] = token;
}

}  // namespace

std::string CopyToDevice(const void* host, size_t bytes, void** device) {
  if (cudaError_t e = cudaMalloc(device, bytes); e != cudaSuccess) return ErrorText(e);
  return ErrorText(cudaMemcpy(*device, host, bytes, cudaMemcpyHostToDevice));
}

std::string FreeDevice(void* device) { return ErrorText(cudaFree(device)); }

std::string SubsetAdcSearch(const float* luts, int num_queries, const uint8_t* codes, int m_count,
                            const int64_t* range_begin, const int64_t* range_prefix,
                            int num_ranges, int64_t total, bool inner_product, int k,
                            float* host_distances, int64_t* host_ids) {
  float* distances = nullptr;
  int64_t* ids = nullptr;
  const size_t n = static_cast<size_t>(num_queries) * total;
  if (cudaError_t e = cudaMalloc(&distances, n * sizeof(float)); e != cudaSuccess) {
    return ErrorText(e);
  }
  if (cudaError_t e = cudaMalloc(&ids, n * sizeof(int64_t)); e != cudaSuccess) {
    cudaFree(distances);
    return ErrorText(e);
  }
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>((total + kThreads - 1) / kThreads), num_queries);
  AdcDistancesKernel<<<grid, kThreads>>>(luts, num_queries, codes, m_count, range_begin,
                                         range_prefix, num_ranges, total, distances, ids);
  std::string error = ErrorText(cudaGetLastError());
  for (int q = 0; q < num_queries && error.empty(); ++q) {
    thrust::device_ptr<float> d(distances + q * total);
    thrust::device_ptr<int64_t> i(ids + q * total);
    if (inner_product) {
      thrust::stable_sort_by_key(thrust::device, d, d + total, i, thrust::greater<float>());
    } else {
      thrust::stable_sort_by_key(thrust::device, d, d + total, i);
    }
    error = ErrorText(cudaMemcpy(host_distances + static_cast<int64_t>(q) * k,
                                 distances + q * total, k * sizeof(float),
                                 cudaMemcpyDeviceToHost));
    if (error.empty()) {
      error = ErrorText(cudaMemcpy(host_ids + static_cast<int64_t>(q) * k, ids + q * total,
                                   k * sizeof(int64_t), cudaMemcpyDeviceToHost));
    }
  }
  cudaFree(distances);
  cudaFree(ids);
  return error;
}

}  // namespace knnserve::cuda
