// In index_test, which builds with OpenMP: the regions here are real parallel regions.
#include "common/parallel_exceptions.h"

#include <omp.h>

#include <atomic>
#include <new>
#include <stdexcept>

#include "common/omp_threads.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve {
namespace {

using ::knnserve::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kIterations = 64;

// Runs kIterations iterations on 4 threads, iteration `throwing` throwing `exception`; returns
// how many iterations finished.
template <typename Exception>
int RunRegion(ParallelExceptions& exceptions, int throwing, const Exception& exception) {
  std::atomic<int> finished{0};
  std::atomic<bool> parallel{false};
  const ScopedOmpThreads threads(4);
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = 0; i < kIterations; ++i) {
    exceptions.Run([&] {
      if (omp_in_parallel()) parallel = true;
      if (i == throwing) throw exception;
      ++finished;
    });
  }
  EXPECT_TRUE(parallel);
  return finished;
}

TEST(ParallelExceptions, AnOutOfMemoryInARegionBecomesResourceExhaustedAfterIt) {
  ParallelExceptions exceptions;
  EXPECT_EQ(RunRegion(exceptions, 37, std::bad_alloc()), kIterations - 1);
  EXPECT_THAT(exceptions.ToStatus("IVF ADC search"),
              StatusIs(absl::StatusCode::kResourceExhausted, "IVF ADC search: out of memory"));
  EXPECT_THROW(exceptions.RethrowFirst(), std::bad_alloc);
}

TEST(ParallelExceptions, OtherExceptionsBecomeInternalWithTheirMessage) {
  ParallelExceptions exceptions;
  EXPECT_EQ(RunRegion(exceptions, 0, std::runtime_error("list 7 is corrupt")), kIterations - 1);
  EXPECT_THAT(exceptions.ToStatus("subset ADC search"),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("subset ADC search: list 7")));
  EXPECT_THROW(exceptions.RethrowFirst(), std::runtime_error);
}

TEST(ParallelExceptions, KeepsOneExceptionWhenSeveralThreadsThrow) {
  ParallelExceptions exceptions;
  const ScopedOmpThreads threads(4);
#pragma omp parallel for
  for (int i = 0; i < kIterations; ++i) {
    exceptions.Run([] { throw std::bad_alloc(); });
  }
  EXPECT_THAT(exceptions.ToStatus("search"),
              StatusIs(absl::StatusCode::kResourceExhausted, "search: out of memory"));
}

TEST(ParallelExceptions, NothingThrownIsOk) {
  ParallelExceptions exceptions;
  EXPECT_EQ(RunRegion(exceptions, -1, std::bad_alloc()), kIterations);
  EXPECT_OK(exceptions.ToStatus("search"));
  EXPECT_NO_THROW(exceptions.RethrowFirst());
}

}  // namespace
}  // namespace knnserve
