#include "common/half.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace knnserve {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Half, KnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);            // largest finite half
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);            // rounds down
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);            // ties to even: overflow to Inf
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie with zero rounds to even
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Half, F16CEqualsScalarForEveryHalf) {
  if (!CpuHasF16C()) GTEST_SKIP() << "this CPU has no F16C";
  std::vector<uint16_t> halves(65536);
  for (uint32_t h = 0; h < 65536; ++h) halves[h] = static_cast<uint16_t>(h);
  std::vector<float> fast(65536), scalar(65536);
  HalvesToFloats(halves.data(), halves.size(), fast.data());
  internal::HalvesToFloatsScalar(halves.data(), halves.size(), scalar.data());
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(Bits(fast[h]), Bits(scalar[h])) << "half 0x" << std::hex << h;
  }
}

TEST(Half, F16CEqualsScalarForRandomAndEdgeFloats) {
  if (!CpuHasF16C()) GTEST_SKIP() << "this CPU has no F16C";
  std::mt19937 rng(7);
  std::vector<float> floats;
  // Random bit patterns cover every exponent; scaled normals cover the half range densely.
  std::uniform_int_distribution<uint32_t> bits;
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int i = 0; i < 200000; ++i) floats.push_back(FromBits(bits(rng)));
  for (int i = 0; i < 200000; ++i) floats.push_back(normal(rng));
  for (int e = -30; e <= 17; ++e) {  // neighbours of every power of two and of the ties
    for (float m : {1.0f, 1.5f, 1.0009765625f, 1.00048828125f, 1.99951171875f}) {
      const float f = std::ldexp(m, e);
      floats.insert(floats.end(), {f, -f, std::nextafter(f, 0.0f), std::nextafter(f, 1e9f)});
    }
  }
  floats.size() % 8 == 0 ? floats.push_back(1.0f) : void();  // exercise the scalar tail
  std::vector<uint16_t> fast(floats.size()), scalar(floats.size());
  FloatsToHalves(floats.data(), floats.size(), fast.data());
  internal::FloatsToHalvesScalar(floats.data(), floats.size(), scalar.data());
  for (size_t i = 0; i < floats.size(); ++i) {
    ASSERT_EQ(fast[i], scalar[i]) << "float " << floats[i] << " bits 0x" << std::hex
                                  << Bits(floats[i]);
  }
}

}  // namespace
}  // namespace knnserve
