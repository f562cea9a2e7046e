#include "common/half.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KNNSERVE_X86 1
#endif

namespace knnserve {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

#ifdef KNNSERVE_X86
__attribute__((target("f16c,avx"))) void HalvesToFloatsF16C(const uint16_t* src, size_t n,
                                                             float* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  internal::HalvesToFloatsScalar(src + i, n - i, dst + i);
}

__attribute__((target("f16c,avx"))) void FloatsToHalvesF16C(const float* src, size_t n,
                                                             uint16_t* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  internal::FloatsToHalvesScalar(src + i, n - i, dst + i);
}
#endif

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // Inf, or NaN: quieted with its payload kept, as F16C does.
    const uint32_t quiet = mantissa != 0 ? 0x400000u : 0u;
    return BitsToFloat(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent != 0) {
    return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  if (mantissa == 0) return BitsToFloat(sign);  // signed zero
  // Subnormal half: normalize into a float exponent.
  int shift = 0;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shift;
  }
  mantissa &= 0x3ffu;
  return BitsToFloat(sign | ((113 - shift) << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN; NaN stays quiet NaN with the top payload bits.
    if (abs == 0x7f800000u) return sign | 0x7c00u;
    return sign | 0x7e00u | static_cast<uint16_t>((abs >> 13) & 0x3ffu);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to Inf
  if (abs < 0x38800000u) {                        // below the smallest normal half (2^-14)
    if (abs < 0x33000000u) return sign;           // below half the smallest subnormal: zero
    // Subnormal: shift the full mantissa (with its implicit 1) and round to nearest even.
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24 (to 10-bit half mantissa at 2^-24 ulp)
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even. A carry
  // out of the mantissa correctly bumps the exponent.
  uint32_t half = ((abs - 0x38000000u) >> 13);
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

bool CpuHasF16C() {
#ifdef KNNSERVE_X86
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
#else
  return false;
#endif
}

void HalvesToFloats(const uint16_t* src, size_t n, float* dst) {
#ifdef KNNSERVE_X86
  if (CpuHasF16C()) return HalvesToFloatsF16C(src, n, dst);
#endif
  internal::HalvesToFloatsScalar(src, n, dst);
}

void FloatsToHalves(const float* src, size_t n, uint16_t* dst) {
#ifdef KNNSERVE_X86
  if (CpuHasF16C()) return FloatsToHalvesF16C(src, n, dst);
#endif
  internal::FloatsToHalvesScalar(src, n, dst);
}

namespace internal {

void HalvesToFloatsScalar(const uint16_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

void FloatsToHalvesScalar(const float* src, size_t n, uint16_t* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

}  // namespace internal
}  // namespace knnserve
