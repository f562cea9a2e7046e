// IEEE-754 binary16 <-> binary32 conversion. The bulk functions use F16C when the CPU has it
// (checked once at run time) and a bit-exact scalar fallback otherwise; both round to nearest
// even and keep NaN, Inf, subnormals and signed zeros.
#ifndef KNNSERVE_COMMON_HALF_H_
#define KNNSERVE_COMMON_HALF_H_

#include <cstddef>
#include <cstdint>

namespace knnserve {

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

// Converts n values; src and dst must not overlap.
void HalvesToFloats(const uint16_t* src, size_t n, float* dst);
void FloatsToHalves(const float* src, size_t n, uint16_t* dst);

// True when the bulk functions use the F16C instructions.
bool CpuHasF16C();

namespace internal {
// The scalar paths, exposed so tests can compare them with the F16C paths.
void HalvesToFloatsScalar(const uint16_t* src, size_t n, float* dst);
void FloatsToHalvesScalar(const float* src, size_t n, uint16_t* dst);
}  // namespace internal

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_HALF_H_
