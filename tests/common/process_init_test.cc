// In index_test, which loads OpenBLAS (through faiss and libblas), so that the last test sees
// what InitProcess did to this very process (tests/testing/test_main.cc calls it).
#include "common/process_init.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace knnserve {
namespace {

constexpr CpuVectorFeatures kAvx512{.avx2_fma = true, .avx512 = true};
constexpr CpuVectorFeatures kAvx2{.avx2_fma = true, .avx512 = false};
constexpr CpuVectorFeatures kSse{};

TEST(OpenBlasCoreFor, ReplacesOnlyThePrescottFallback) {
  EXPECT_STREQ(OpenBlasCoreFor("Prescott", kAvx512), "SkylakeX");
  EXPECT_STREQ(OpenBlasCoreFor("Prescott", kAvx2), "Haswell");
  EXPECT_EQ(OpenBlasCoreFor("Prescott", kSse), nullptr);
  EXPECT_EQ(OpenBlasCoreFor("Haswell", kAvx512), nullptr);
  EXPECT_EQ(OpenBlasCoreFor("Zen", kAvx2), nullptr);
  EXPECT_EQ(OpenBlasCoreFor("SkylakeX", kAvx512), nullptr);
  EXPECT_EQ(OpenBlasCoreFor(nullptr, kAvx512), nullptr);
}

TEST(InitProcess, LeavesOpenBlasOnKernelsBeyondSse3WhereTheCpuHasAvx2) {
  using CoreNameFn = char* (*)();
  const auto core_name =
      reinterpret_cast<CoreNameFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (core_name == nullptr) GTEST_SKIP() << "BLAS is not OpenBLAS";
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    GTEST_SKIP() << "no AVX2";
  }
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced != nullptr && std::string(forced) == "Prescott") GTEST_SKIP() << "forced Prescott";
  EXPECT_STRNE(core_name(), "Prescott");
}

}  // namespace
}  // namespace knnserve
