// Kernel selection and the scalar reference kernel (compiled without extra ISA flags).
#include "common/adc/adc_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "common/check.h"

namespace knnserve {

namespace {

// The instruction sets the kernels use, in increasing order: each level includes the ones below.
enum class Isa { kScalar, kAvx2, kAvx512, kAvx512Vbmi };
constexpr std::pair<absl::string_view, Isa> kIsaNames[] = {{"scalar", Isa::kScalar},
                                                           {"avx2", Isa::kAvx2},
                                                           {"avx512", Isa::kAvx512},
                                                           {"avx512vbmi", Isa::kAvx512Vbmi}};

Isa DetectedIsa() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return Isa::kScalar;
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl")) {
    return Isa::kAvx2;
  }
  return __builtin_cpu_supports("avx512vbmi") ? Isa::kAvx512Vbmi : Isa::kAvx512;
}

// The CPU's level, capped by KNNSERVE_ISA (adc_kernels.h).
Isa UsableIsa() {
  static const Isa usable = [] {
    const Isa detected = DetectedIsa();
    const char* cap = std::getenv("KNNSERVE_ISA");
    if (cap == nullptr || *cap == '\0') return detected;
    for (const auto& [name, isa] : kIsaNames) {
      if (name == cap) return std::min(isa, detected);
    }
    std::fprintf(stderr,
                 "knnserve: KNNSERVE_ISA=%s is not one of scalar, avx2, avx512, avx512vbmi\n", cap);
    std::abort();
  }();
  return usable;
}

Isa RequiredIsa(AdcKernel kernel) {
  switch (kernel) {
    case AdcKernel::kScalar:
    case AdcKernel::kQuantizedScalar:
      return Isa::kScalar;
    case AdcKernel::kAvx2:
    case AdcKernel::kQuantizedAvx2:
      return Isa::kAvx2;
    case AdcKernel::kAvx512:
      return Isa::kAvx512;
    case AdcKernel::kQuantizedVbmi:
      return Isa::kAvx512Vbmi;
  }
  return Isa::kAvx512Vbmi;
}

}  // namespace

absl::string_view AdcKernelName(AdcKernel kernel) {
  switch (kernel) {
    case AdcKernel::kScalar:
      return "scalar";
    case AdcKernel::kAvx2:
      return "avx2";
    case AdcKernel::kAvx512:
      return "avx512";
    case AdcKernel::kQuantizedScalar:
      return "quantized-scalar";
    case AdcKernel::kQuantizedAvx2:
      return "quantized-avx2";
    case AdcKernel::kQuantizedVbmi:
      return "quantized-avx512vbmi";
  }
  return "unknown";
}

bool CpuSupports(AdcKernel kernel) { return RequiredIsa(kernel) <= UsableIsa(); }

bool IsQuantized(AdcKernel kernel) {
  return kernel == AdcKernel::kQuantizedScalar || kernel == AdcKernel::kQuantizedAvx2 ||
         kernel == AdcKernel::kQuantizedVbmi;
}

AdcKernel BestExactAdcKernel() {
  return CpuSupports(AdcKernel::kAvx512) ? AdcKernel::kAvx512
         : CpuSupports(AdcKernel::kAvx2) ? AdcKernel::kAvx2
                                         : AdcKernel::kScalar;
}

AdcKernel BestAdcKernel() {
  // The quantized scans beat the exact ones at every level, the scalar one included (its
  // integer sums replace float gathers; re-ranking the few survivors costs little).
  return CpuSupports(AdcKernel::kQuantizedVbmi)   ? AdcKernel::kQuantizedVbmi
         : CpuSupports(AdcKernel::kQuantizedAvx2) ? AdcKernel::kQuantizedAvx2
                                                  : AdcKernel::kQuantizedScalar;
}

AdcScanFn GetAdcScan(AdcKernel kernel) {
  KNNSERVE_CHECK(CpuSupports(kernel), "ADC kernel not supported by this CPU");
  switch (kernel) {
    case AdcKernel::kAvx2:
      return adc_internal::ScanAvx2;
    case AdcKernel::kAvx512:
      return adc_internal::ScanAvx512;
    default:  // the scalar scan, and the quantized kernels' re-rank
      return adc_internal::ScanScalar;
  }
}

AdcLutFn BestAdcLut() {
  return CpuSupports(AdcKernel::kAvx512) ? adc_internal::LutAvx512
         : CpuSupports(AdcKernel::kAvx2) ? adc_internal::LutAvx2
                                         : adc_internal::LutScalar;
}

QuantizedAdcKernels GetQuantizedKernels(AdcKernel kernel) {
  KNNSERVE_CHECK(IsQuantized(kernel) && CpuSupports(kernel), "not a quantized ADC kernel here");
  switch (kernel) {
    case AdcKernel::kQuantizedVbmi:
      return {adc_internal::PackVbmi, adc_internal::ScanQuantizedVbmi};
    case AdcKernel::kQuantizedAvx2:
      return {adc_internal::PackScalar, adc_internal::ScanQuantizedAvx2};
    default:
      return {adc_internal::PackScalar, adc_internal::ScanQuantizedScalar};
  }
}

const AdcTableKernels& BestAdcTableKernels() {
  static const AdcTableKernels kernels =
      CpuSupports(AdcKernel::kAvx512)
          ? AdcTableKernels{adc_internal::RowRangesAvx512, adc_internal::QuantizeRowsAvx512,
                            adc_internal::ResidualLutsAvx512}
      : CpuSupports(AdcKernel::kAvx2)
          ? AdcTableKernels{adc_internal::RowRangesAvx2, adc_internal::QuantizeRowsAvx2,
                            adc_internal::ResidualLutsAvx2}
          : AdcTableKernels{adc_internal::RowRangesScalar, adc_internal::QuantizeRowsScalar,
                            adc_internal::ResidualLutsScalar};
  return kernels;
}

namespace adc_internal {

void ScanScalar(const float* const* luts, int num_queries, const uint8_t* codes, int64_t n,
                int m_count, float* out) {
  const int full = m_count / 16 * 16;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* code = codes + i * m_count;
    for (int q = 0; q < num_queries; ++q) {
      const float* lut = luts[q];
      // 16 independent partial sums (the canonical lanes): the loads of one chunk overlap.
      float acc[16] = {};
      for (int mb = 0; mb < full; mb += 16) {
        const float* l = lut + mb * 256;
        const uint8_t* c = code + mb;
        for (int j = 0; j < 16; ++j) acc[j] += l[j * 256 + c[j]];
      }
      for (int m = full; m < m_count; ++m) acc[m - full] += lut[m * 256 + code[m]];
      for (int j = 0; j < 8; ++j) acc[j] += acc[j + 8];
      for (int j = 0; j < 4; ++j) acc[j] += acc[j + 4];
      for (int j = 0; j < 2; ++j) acc[j] += acc[j + 2];
      out[q * n + i] = acc[0] + acc[1];
    }
  }
}

void LutScalar(const float* query, const float* centroids_t, int m_count, int dsub, bool l2,
               float* lut) {
  for (int m = 0; m < m_count; ++m) {
    float* row = lut + m * 256;
    std::fill(row, row + 256, 0.0f);
    // Loop order j-outer, centroid-inner: the inner loop is contiguous and vectorises.
    for (int j = 0; j < dsub; ++j) {
      const float x = query[m * dsub + j];
      const float* ct = centroids_t + (static_cast<size_t>(m) * dsub + j) * 256;
      if (l2) {
        for (int c = 0; c < 256; ++c) {
          const float diff = x - ct[c];
          row[c] += diff * diff;
        }
      } else {
        for (int c = 0; c < 256; ++c) row[c] += x * ct[c];
      }
    }
  }
}

void RowRangesScalar(const float* lut, int m_count, float* lo, float* hi) {
  // Sixteen running lanes: the compiler vectorises element-wise minima but not a float min
  // reduction (NaN and -0 rules).
  constexpr int kLanes = 16;
  for (int m = 0; m < m_count; ++m) {
    const float* row = lut + m * 256;
    float l[kLanes], h[kLanes];
    std::copy(row, row + kLanes, l);
    std::copy(row, row + kLanes, h);
    for (int c = kLanes; c < 256; c += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        l[j] = std::min(l[j], row[c + j]);
        h[j] = std::max(h[j], row[c + j]);
      }
    }
    lo[m] = *std::min_element(l, l + kLanes);
    hi[m] = *std::max_element(h, h + kLanes);
  }
}

void QuantizeRowsScalar(const float* lut, int m_count, float sign, const float* mins, float inverse,
                        uint8_t* table) {
  for (int m = 0; m < m_count; ++m) {
    for (int c = 0; c < 256; ++c) {
      const float v = (sign * lut[m * 256 + c] - mins[m]) * inverse;
      table[m * 256 + c] = static_cast<uint8_t>(std::min(255.0f, v));
    }
  }
}

void ResidualLutsScalar(const float* const* xs, int num, const float* centroids_t,
                        const float* norms, int m_count, int dsub, float* const* luts) {
  for (int i = 0; i < num; ++i) {
    for (int m = 0; m < m_count; ++m) {
      float* row = luts[i] + m * 256;
      std::copy(norms + m * 256, norms + (m + 1) * 256, row);
      for (int j = 0; j < dsub; ++j) {
        const float w = -2.0f * xs[i][m * dsub + j];
        const float* ct = centroids_t + (static_cast<size_t>(m) * dsub + j) * 256;
        for (int c = 0; c < 256; ++c) row[c] = std::fma(w, ct[c], row[c]);
      }
    }
  }
}

void PackScalar(const uint8_t* const* rows, int m_count, uint8_t* block) {
  for (int i = 0; i < kAdcBlock; ++i) {
    for (int m = 0; m < m_count; ++m) block[m * kAdcBlock + i] = rows[i][m];
  }
}

void ScanQuantizedScalar(const uint8_t* const* tables, int num_queries, const uint8_t* block,
                         int m_count, const uint16_t* const* biases, const uint16_t* limits,
                         uint16_t* sums, uint64_t* below) {
  for (int q = 0; q < num_queries; ++q) {
    uint16_t* out = sums + q * kAdcBlock;
    std::fill(out, out + kAdcBlock, uint16_t{0});
    for (int m = 0; m < m_count; ++m) {
      const uint8_t* table = tables[q] + m * 256;
      const uint8_t* codes = block + m * kAdcBlock;
      for (int i = 0; i < kAdcBlock; ++i) out[i] += table[codes[i]];
    }
    if (biases != nullptr) {
      for (int i = 0; i < kAdcBlock; ++i) out[i] = std::min(65535, out[i] + biases[q][i]);
    }
    below[q] = 0;
    for (int i = 0; i < kAdcBlock; ++i) {
      if (out[i] <= limits[q]) below[q] |= uint64_t{1} << i;
    }
  }
}

}  // namespace adc_internal
}  // namespace knnserve
