// The inner loop of subset ADC: distances of PQ codes to queries through their lookup tables.
// Three implementations (scalar, AVX2, AVX-512) in separate translation units compiled with
// their own instruction-set flags; BestAdcKernel() picks one at run time from the CPU's
// features. All three return bit-identical results: every implementation sums the M table
// entries of a code in the same canonical order (16 partial sums, partial j taking sub-quantizers
// m = j, j + 16, ..., in increasing m, then the tree (j + 8), (j + 4), (j + 2), (j + 1)), which
// is exactly the lane order of one 16-wide AVX-512 or two 8-wide AVX2 accumulators.
#ifndef KNNSERVE_COMMON_ADC_ADC_KERNELS_H_
#define KNNSERVE_COMMON_ADC_ADC_KERNELS_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace knnserve {

enum class AdcKernel { kScalar, kAvx2, kAvx512 };

absl::string_view AdcKernelName(AdcKernel kernel);
// True when this CPU can run `kernel`.
bool CpuSupports(AdcKernel kernel);
// The fastest kernel this CPU supports.
AdcKernel BestAdcKernel();

// Upper bound on M accepted by the kernels.
inline constexpr int kMaxAdcM = 256;

// For each query q < num_queries and vector i < n:
//   out[q * n + i] = Σ_m luts[q][m * 256 + codes[i * m_count + m]]   (canonical order above)
// luts[q] points at m_count x 256 floats; codes is n x m_count bytes, row-major.
// REQUIRES: 1 <= m_count <= kMaxAdcM; CpuSupports(kernel).
using AdcScanFn = void (*)(const float* const* luts, int num_queries, const uint8_t* codes,
                           int64_t n, int m_count, float* out);

AdcScanFn GetAdcScan(AdcKernel kernel);

namespace adc_internal {
void ScanScalar(const float* const* luts, int num_queries, const uint8_t* codes, int64_t n,
                int m_count, float* out);
void ScanAvx2(const float* const* luts, int num_queries, const uint8_t* codes, int64_t n,
              int m_count, float* out);
void ScanAvx512(const float* const* luts, int num_queries, const uint8_t* codes, int64_t n,
                int m_count, float* out);
}  // namespace adc_internal

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_ADC_ADC_KERNELS_H_
