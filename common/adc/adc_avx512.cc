// AVX-512 ADC kernel (this file alone is compiled with -mavx512f -mavx512bw -mavx512vl). One
// 16-lane accumulator holds the canonical partial sums (adc_kernels.h); the codes of a vector
// are widened to table indices once and reused by every query of the group.
#include <immintrin.h>

#include "common/adc/adc_kernels.h"

namespace knnserve::adc_internal {
namespace {

// Canonical tree: (j + 8), (j + 4), (j + 2), (j + 1).
inline float Reduce(__m512 acc) {
  const __m256 s8 =
      _mm256_add_ps(_mm512_castps512_ps256(acc),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

}  // namespace

void ScanAvx512(const float* const* luts, int num_queries, const uint8_t* codes, int64_t n,
                int m_count, float* out) {
  const int chunks = (m_count + 15) / 16;
  const int rem = m_count % 16;
  const __mmask16 tail = rem == 0 ? __mmask16(0xFFFF) : __mmask16((1u << rem) - 1);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i index[kMaxAdcM / 16];
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* code = codes + i * m_count;
    for (int c = 0; c < chunks; ++c) {
      const __mmask16 mask = c == chunks - 1 ? tail : __mmask16(0xFFFF);
      const __m128i b = _mm_maskz_loadu_epi8(mask, code + 16 * c);
      const __m512i sub = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * c));
      index[c] = _mm512_add_epi32(_mm512_slli_epi32(sub, 8), _mm512_cvtepu8_epi32(b));
    }
    for (int q = 0; q < num_queries; ++q) {
      const float* lut = luts[q];
      __m512 acc = _mm512_setzero_ps();
      for (int c = 0; c < chunks - 1; ++c) {
        acc = _mm512_add_ps(acc, _mm512_i32gather_ps(index[c], lut, 4));
      }
      acc = _mm512_add_ps(
          acc, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), tail, index[chunks - 1], lut, 4));
      out[q * n + i] = Reduce(acc);
    }
  }
}

void LutAvx512(const float* query, const float* centroids_t, int m_count, int dsub, bool l2,
               float* lut) {
  // Separate multiply and add (this file is compiled with -ffp-contract=off): the same
  // operations per entry as LutScalar, so the tables are bit-identical.
  for (int m = 0; m < m_count; ++m) {
    float* row = lut + m * 256;
    const float* ct_m = centroids_t + static_cast<size_t>(m) * dsub * 256;
    for (int c = 0; c < 256; c += 16) {
      __m512 acc = _mm512_setzero_ps();
      for (int j = 0; j < dsub; ++j) {
        const __m512 x = _mm512_set1_ps(query[m * dsub + j]);
        const __m512 ct = _mm512_loadu_ps(ct_m + j * 256 + c);
        if (l2) {
          const __m512 diff = _mm512_sub_ps(x, ct);
          acc = _mm512_add_ps(acc, _mm512_mul_ps(diff, diff));
        } else {
          acc = _mm512_add_ps(acc, _mm512_mul_ps(x, ct));
        }
      }
      _mm512_storeu_ps(row + c, acc);
    }
  }
}

}  // namespace knnserve::adc_internal
