// AVX2 ADC kernel (this file alone is compiled with -mavx2). Two 8-lane accumulators hold the
// 16 canonical partial sums (adc_kernels.h); the codes of a vector are widened to table indices
// once and reused by every query of the group.
#include <immintrin.h>

#include <cstring>

#include "common/adc/adc_kernels.h"

namespace knnserve::adc_internal {
namespace {

// Canonical tree: (j + 8) is lo + hi, then (j + 4), (j + 2), (j + 1).
inline float Reduce(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

}  // namespace

void ScanAvx2(const float* const* luts, int num_queries, const uint8_t* codes, int64_t n,
              int m_count, float* out) {
  const int chunks = (m_count + 15) / 16;
  const int rem = m_count % 16;  // sub-quantizers in a partial last chunk, 0 if none
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i index[2 * kMaxAdcM / 16];
  __m256i mask[2];  // lanes of the partial chunk that hold a sub-quantizer
  for (int h = 0; h < 2; ++h) {
    mask[h] = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem - 8 * h), lane);
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* code = codes + i * m_count;
    for (int c = 0; c < chunks; ++c) {
      alignas(16) uint8_t bytes[16] = {};
      const bool partial = rem != 0 && c == chunks - 1;
      std::memcpy(bytes, code + 16 * c, partial ? rem : 16);
      const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(bytes));
      for (int h = 0; h < 2; ++h) {
        const __m256i base = _mm256_add_epi32(
            lane, _mm256_set1_epi32(16 * c + 8 * h));  // sub-quantizer of each lane
        const __m128i b8 = h == 0 ? b : _mm_srli_si128(b, 8);
        index[2 * c + h] = _mm256_add_epi32(_mm256_slli_epi32(base, 8), _mm256_cvtepu8_epi32(b8));
      }
    }
    for (int q = 0; q < num_queries; ++q) {
      const float* lut = luts[q];
      __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int c = 0; c < chunks; ++c) {
        const bool partial = rem != 0 && c == chunks - 1;
        for (int h = 0; h < 2; ++h) {
          const __m256 v =
              partial ? _mm256_mask_i32gather_ps(_mm256_setzero_ps(), lut, index[2 * c + h],
                                                 _mm256_castsi256_ps(mask[h]), 4)
                      : _mm256_i32gather_ps(lut, index[2 * c + h], 4);
          acc[h] = _mm256_add_ps(acc[h], v);
        }
      }
      out[q * n + i] = Reduce(acc[0], acc[1]);
    }
  }
}

}  // namespace knnserve::adc_internal
