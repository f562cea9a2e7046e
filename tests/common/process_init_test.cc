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

TEST(MallocParameterConfigured, NamesOnlyTheParametersTheEnvironmentSets) {
  const MallocParameter trim = MallocParameter::kTrimThreshold;
  EXPECT_FALSE(MallocParameterConfigured(trim, nullptr, nullptr));
  EXPECT_FALSE(MallocParameterConfigured(trim, "", nullptr));
  EXPECT_TRUE(MallocParameterConfigured(trim, "glibc.malloc.trim_threshold=1", nullptr));
  EXPECT_TRUE(MallocParameterConfigured(
      trim, "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=1", nullptr));
  // Another malloc tunable (the usual arena_max) leaves this parameter to knnserve.
  EXPECT_FALSE(MallocParameterConfigured(trim, "glibc.malloc.arena_max=2", nullptr));
  EXPECT_FALSE(MallocParameterConfigured(trim, "glibc.malloc.trim_threshold_x=1", nullptr));
  EXPECT_FALSE(MallocParameterConfigured(trim, "xglibc.malloc.trim_threshold=1", nullptr));
  EXPECT_FALSE(MallocParameterConfigured(MallocParameter::kMmapThreshold,
                                         "glibc.malloc.trim_threshold=1", nullptr));
  EXPECT_TRUE(MallocParameterConfigured(MallocParameter::kMmapThreshold,
                                        "glibc.malloc.mmap_threshold=1:", nullptr));
  EXPECT_TRUE(MallocParameterConfigured(MallocParameter::kTopPad, "glibc.malloc.top_pad", nullptr));
  // glibc's older variable, e.g. MALLOC_TRIM_THRESHOLD_, set to anything.
  EXPECT_TRUE(MallocParameterConfigured(trim, nullptr, "1048576"));
  EXPECT_TRUE(MallocParameterConfigured(MallocParameter::kMmapMax, "", ""));
}

}  // namespace
}  // namespace knnserve
