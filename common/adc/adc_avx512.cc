// AVX-512 ADC kernel (this file alone is compiled with -mavx512f -mavx512bw -mavx512vl). One
// 16-lane accumulator holds the canonical partial sums (adc_kernels.h); the codes of a vector
// are widened to table indices once and reused by every query of the group.
#include <immintrin.h>

#include "common/adc/adc_kernels.h"
#include "common/adc/simd_tables.h"

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

namespace {

struct Avx512Ops {
  using V = __m512;
  static constexpr int kWidth = 16;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set(float x) { return _mm512_set1_ps(x); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};

}  // namespace

void LutAvx512(const float* query, const float* centroids_t, int m_count, int dsub, bool l2,
               float* lut) {
  LutSimd<Avx512Ops>(query, centroids_t, m_count, dsub, l2, lut);
}

void RowRangesAvx512(const float* lut, int m_count, float* lo, float* hi) {
  for (int m = 0; m < m_count; ++m) {
    const float* row = lut + m * 256;
    __m512 mn = _mm512_loadu_ps(row);
    __m512 mx = mn;
    for (int c = 16; c < 256; c += 16) {
      const __m512 x = _mm512_loadu_ps(row + c);
      mn = _mm512_min_ps(mn, x);
      mx = _mm512_max_ps(mx, x);
    }
    lo[m] = _mm512_reduce_min_ps(mn);
    hi[m] = _mm512_reduce_max_ps(mx);
  }
}

void QuantizeRowsAvx512(const float* lut, int m_count, float sign, const float* mins, float inverse,
                        uint8_t* table) {
  // The same operations, in the same order, as QuantizeRowsScalar: bit-identical bytes.
  const __m512 s = _mm512_set1_ps(sign);
  const __m512 inv = _mm512_set1_ps(inverse);
  const __m512 top = _mm512_set1_ps(255.0f);
  for (int m = 0; m < m_count; ++m) {
    const __m512 mn = _mm512_set1_ps(mins[m]);
    for (int c = 0; c < 256; c += 16) {
      const __m512 x = _mm512_loadu_ps(lut + m * 256 + c);
      const __m512 v =
          _mm512_min_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(s, x), mn), inv), top);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(table + m * 256 + c),
                       _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)));
    }
  }
}

void ResidualLutsAvx512(const float* const* xs, int num, const float* centroids_t,
                        const float* norms, int m_count, int dsub, float* const* luts) {
  ResidualLutsSimd<Avx512Ops>(xs, num, centroids_t, norms, m_count, dsub, luts);
}

}  // namespace knnserve::adc_internal
