// The inner loops of subset ADC: distances of PQ codes to queries through their lookup tables.
//
// Exact float scans: three implementations (scalar, AVX2, AVX-512) in separate translation units
// compiled with their own instruction-set flags. All three return bit-identical results: every
// implementation sums the M table entries of a code in the same canonical order (16 partial sums,
// partial j taking sub-quantizers m = j, j + 16, ..., in increasing m, then the tree (j + 8),
// (j + 4), (j + 2), (j + 1)), which is exactly the lane order of one 16-wide AVX-512 or two 8-wide
// AVX2 accumulators.
//
// Quantized two-stage scans (kQuantizedScalar, kQuantizedAvx2, kQuantizedVbmi): the float table
// of a query is quantized to 8-bit entries, codes are packed in blocks of kAdcBlock vectors and
// scanned with 16-bit integer sums (with AVX-512 VBMI the 256-entry tables live in registers: 64
// look-ups per instruction instead of one gather lane each; with AVX2, 16-entry vpshufb look-ups
// and blends); the integer sums bound every exact distance, so only the vectors that can still
// be among the k best are re-ranked with the exact scalar scan. Their final answers are
// therefore identical to the exact scans' (subset_adc.cc), and all three quantized scans give
// identical sums.
//
// BestAdcKernel() picks the fastest at run time from the CPU's features. The environment
// variable KNNSERVE_ISA (scalar, avx2, avx512, avx512vbmi) caps the instruction sets that these
// kernels may use, as if the CPU had no more: to run, measure or test a slower machine's path on
// a faster one. An unknown value stops the process with a message that names it.
#ifndef KNNSERVE_COMMON_ADC_ADC_KERNELS_H_
#define KNNSERVE_COMMON_ADC_ADC_KERNELS_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace knnserve {

enum class AdcKernel { kScalar, kAvx2, kAvx512, kQuantizedScalar, kQuantizedAvx2, kQuantizedVbmi };

absl::string_view AdcKernelName(AdcKernel kernel);
// True when this CPU can run `kernel` (within KNNSERVE_ISA).
bool CpuSupports(AdcKernel kernel);
// The fastest kernel this CPU supports.
AdcKernel BestAdcKernel();
// The fastest of the exact float kernels (kScalar, kAvx2, kAvx512) this CPU supports.
AdcKernel BestExactAdcKernel();
// True for the two-stage kernels (quantized scan + exact re-rank).
bool IsQuantized(AdcKernel kernel);

// Upper bound on M accepted by the kernels.
inline constexpr int kMaxAdcM = 256;

// For each query q < num_queries and vector i < n:
//   out[q * n + i] = Σ_m luts[q][m * 256 + codes[i * m_count + m]]   (canonical order above)
// luts[q] points at m_count x 256 floats; codes is n x m_count bytes, row-major.
// REQUIRES: 1 <= m_count <= kMaxAdcM; CpuSupports(kernel).
using AdcScanFn = void (*)(const float* const* luts, int num_queries, const uint8_t* codes,
                           int64_t n, int m_count, float* out);

// The exact float scan of `kernel`; the quantized kernels re-rank with the scalar one.
AdcScanFn GetAdcScan(AdcKernel kernel);

// ---- Lookup tables ------------------------------------------------------------------------------
// The m_count x 256 table of one query: lut[m * 256 + c] = Σ_j (query[m * dsub + j] − centroid)²
// (l2) or Σ_j query[m * dsub + j] · centroid (inner product), j in increasing order, where the
// centroid coordinate is centroids_t[(m * dsub + j) * 256 + c] (centroids transposed per
// sub-quantizer). Every implementation does the same operations per entry, in the same order and
// without fused multiply-adds, so all give bit-identical tables.
using AdcLutFn = void (*)(const float* query, const float* centroids_t, int m_count, int dsub,
                          bool l2, float* lut);
// The fastest table builder this CPU supports (independent of the scan kernel, so that every
// kernel of a process sees the same tables).
AdcLutFn BestAdcLut();

// ---- Quantized kernels -------------------------------------------------------------------------
// Vectors per packed block: one AVX-512 register of codes of one sub-quantizer.
inline constexpr int kAdcBlock = 64;

// Packs the codes of kAdcBlock vectors (rows[i] points at the m_count code bytes of vector i)
// sub-quantizer-major: block[m * kAdcBlock + i] = rows[i][m]. block is m_count x kAdcBlock bytes,
// 64-byte aligned.
using AdcPackFn = void (*)(const uint8_t* const* rows, int m_count, uint8_t* block);

// For each query q < num_queries and lane i < kAdcBlock of a packed block:
//   sums[q * kAdcBlock + i] = min(65535, Σ_m tables[q][m * 256 + block[m * kAdcBlock + i]]
//                                        + (biases ? biases[q][i] : 0))
// (the table sums alone stay below 2^16: entries <= 255 and m_count <= kMaxAdcM), and bit i of
// below[q] set iff sums[q * kAdcBlock + i] <= limits[q].
// REQUIRES: 1 <= m_count <= kMaxAdcM; tables[q] holds m_count x 256 bytes; block is aligned;
// biases null or biases[q] holding kAdcBlock values.
using AdcQuantizedScanFn = void (*)(const uint8_t* const* tables, int num_queries,
                                    const uint8_t* block, int m_count,
                                    const uint16_t* const* biases, const uint16_t* limits,
                                    uint16_t* sums, uint64_t* below);

struct QuantizedAdcKernels {
  AdcPackFn pack;
  AdcQuantizedScanFn scan;
};
// REQUIRES: IsQuantized(kernel) && CpuSupports(kernel).
QuantizedAdcKernels GetQuantizedKernels(AdcKernel kernel);

// Table preparation for the quantized scans, on m_count x 256 float tables. Every
// implementation does the same float operations per entry, so all give identical results.
struct AdcTableKernels {
  // lo[m], hi[m]: the smallest and largest entry of row m.
  void (*row_ranges)(const float* lut, int m_count, float* lo, float* hi);
  // table[m * 256 + c] = truncate(min(255, (sign * lut[m * 256 + c] − mins[m]) * inverse)).
  // REQUIRES: sign * lut[m * 256 + c] >= mins[m].
  void (*quantize_rows)(const float* lut, int m_count, float sign, const float* mins, float inverse,
                        uint8_t* table);
  // The L2 tables of IVF residuals less their norms, ||x_m − r||² − ||x_m||², for x = xs[i],
  // i < num, into luts[i]:
  //   luts[i][m * 256 + c] = fma(−2 x[m * dsub + dsub − 1], ct(dsub − 1), … fma(−2 x[m * dsub],
  //                              ct(0), norms[m * 256 + c]))
  // with ct(j) = centroids_t[(m * dsub + j) * 256 + c] and norms the centroids' squared norms
  // (fused multiply-adds in increasing j: the same in every implementation). Several residuals
  // per call so that each centroid is read from memory once for all of them.
  void (*residual_luts)(const float* const* xs, int num, const float* centroids_t,
                        const float* norms, int m_count, int dsub, float* const* luts);
};
// The fastest table kernels this CPU supports.
const AdcTableKernels& BestAdcTableKernels();

namespace adc_internal {
void ScanScalar(const float* const* luts, int num_queries, const uint8_t* codes, int64_t n,
                int m_count, float* out);
void ScanAvx2(const float* const* luts, int num_queries, const uint8_t* codes, int64_t n,
              int m_count, float* out);
void ScanAvx512(const float* const* luts, int num_queries, const uint8_t* codes, int64_t n,
                int m_count, float* out);
void LutScalar(const float* query, const float* centroids_t, int m_count, int dsub, bool l2,
               float* lut);
void LutAvx2(const float* query, const float* centroids_t, int m_count, int dsub, bool l2,
             float* lut);
void LutAvx512(const float* query, const float* centroids_t, int m_count, int dsub, bool l2,
               float* lut);
void RowRangesScalar(const float* lut, int m_count, float* lo, float* hi);
void RowRangesAvx2(const float* lut, int m_count, float* lo, float* hi);
void RowRangesAvx512(const float* lut, int m_count, float* lo, float* hi);
void QuantizeRowsScalar(const float* lut, int m_count, float sign, const float* mins, float inverse,
                        uint8_t* table);
void QuantizeRowsAvx2(const float* lut, int m_count, float sign, const float* mins, float inverse,
                      uint8_t* table);
void QuantizeRowsAvx512(const float* lut, int m_count, float sign, const float* mins, float inverse,
                        uint8_t* table);
void ResidualLutsScalar(const float* const* xs, int num, const float* centroids_t,
                        const float* norms, int m_count, int dsub, float* const* luts);
void ResidualLutsAvx2(const float* const* xs, int num, const float* centroids_t, const float* norms,
                      int m_count, int dsub, float* const* luts);
void ResidualLutsAvx512(const float* const* xs, int num, const float* centroids_t,
                        const float* norms, int m_count, int dsub, float* const* luts);
void PackScalar(const uint8_t* const* rows, int m_count, uint8_t* block);
void PackVbmi(const uint8_t* const* rows, int m_count, uint8_t* block);
void ScanQuantizedScalar(const uint8_t* const* tables, int num_queries, const uint8_t* block,
                         int m_count, const uint16_t* const* biases, const uint16_t* limits,
                         uint16_t* sums, uint64_t* below);
void ScanQuantizedAvx2(const uint8_t* const* tables, int num_queries, const uint8_t* block,
                       int m_count, const uint16_t* const* biases, const uint16_t* limits,
                       uint16_t* sums, uint64_t* below);
void ScanQuantizedVbmi(const uint8_t* const* tables, int num_queries, const uint8_t* block,
                       int m_count, const uint16_t* const* biases, const uint16_t* limits,
                       uint16_t* sums, uint64_t* below);
}  // namespace adc_internal

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_ADC_ADC_KERNELS_H_
