// The float table loops of adc_kernels.h's LUT and residual-table kernels, written once for any
// vector width. Included only by the per-ISA kernel files (adc_avx2.cc, adc_avx512.cc), each of
// which instantiates them with its own vector operations, compiled with its own instruction set.
// Ops provides: a vector type V of kWidth floats; Zero(), Set(float), Load(const float*),
// Store(float*, V); Add, Sub, Mul of two V; Fma(a, b, c) = a * b + c, fused.
// Internal to common/adc.
#ifndef KNNSERVE_COMMON_ADC_SIMD_TABLES_H_
#define KNNSERVE_COMMON_ADC_SIMD_TABLES_H_

#include <cstddef>

namespace knnserve::adc_internal {

// Eight independent accumulators per pass hide the adds' latency.
inline constexpr int kTableChains = 8;

// LutScalar's operations per entry (separate multiply and add: the including file is compiled
// with -ffp-contract=off), so the tables are bit-identical.
template <typename Ops>
void LutSimd(const float* query, const float* centroids_t, int m_count, int dsub, bool l2,
             float* lut) {
  using V = typename Ops::V;
  constexpr int kPass = Ops::kWidth * kTableChains;
  static_assert(256 % kPass == 0);
  for (int m = 0; m < m_count; ++m) {
    float* row = lut + m * 256;
    const float* ct_m = centroids_t + static_cast<size_t>(m) * dsub * 256;
    for (int c0 = 0; c0 < 256; c0 += kPass) {
      V acc[kTableChains];
      for (int a = 0; a < kTableChains; ++a) acc[a] = Ops::Zero();
      for (int j = 0; j < dsub; ++j) {
        const V x = Ops::Set(query[m * dsub + j]);
        for (int a = 0; a < kTableChains; ++a) {
          const V ct = Ops::Load(ct_m + j * 256 + c0 + Ops::kWidth * a);
          if (l2) {
            const V diff = Ops::Sub(x, ct);
            acc[a] = Ops::Add(acc[a], Ops::Mul(diff, diff));
          } else {
            acc[a] = Ops::Add(acc[a], Ops::Mul(x, ct));
          }
        }
      }
      for (int a = 0; a < kTableChains; ++a) Ops::Store(row + c0 + Ops::kWidth * a, acc[a]);
    }
  }
}

// ResidualLutsScalar's fused multiply-adds in increasing j: identical tables. Per sub-quantizer
// the centroids (dsub x 256 floats) stay in L1 while every residual uses them.
template <typename Ops>
void ResidualLutsSimd(const float* const* xs, int num, const float* centroids_t, const float* norms,
                      int m_count, int dsub, float* const* luts) {
  using V = typename Ops::V;
  constexpr int kPass = Ops::kWidth * kTableChains;
  static_assert(256 % kPass == 0);
  for (int m = 0; m < m_count; ++m) {
    const float* ct_m = centroids_t + static_cast<size_t>(m) * dsub * 256;
    for (int i = 0; i < num; ++i) {
      const float* x_m = xs[i] + m * dsub;
      float* row = luts[i] + m * 256;
      for (int c0 = 0; c0 < 256; c0 += kPass) {
        V acc[kTableChains];
        for (int a = 0; a < kTableChains; ++a) {
          acc[a] = Ops::Load(norms + m * 256 + c0 + Ops::kWidth * a);
        }
        for (int j = 0; j < dsub; ++j) {
          const V w = Ops::Set(-2.0f * x_m[j]);
          for (int a = 0; a < kTableChains; ++a) {
            acc[a] = Ops::Fma(w, Ops::Load(ct_m + j * 256 + c0 + Ops::kWidth * a), acc[a]);
          }
        }
        for (int a = 0; a < kTableChains; ++a) Ops::Store(row + c0 + Ops::kWidth * a, acc[a]);
      }
    }
  }
}

}  // namespace knnserve::adc_internal

#endif  // KNNSERVE_COMMON_ADC_SIMD_TABLES_H_
