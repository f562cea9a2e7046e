#include "client/knn/thread_plan.h"

#include "gtest/gtest.h"

namespace knnserve::knn {
namespace {

ThreadRequest Request(const char* mode, bool remote, int threads, int64_t step_rows) {
  ThreadRequest request;
  request.mode = mode;
  request.remote = remote;
  request.threads = threads;
  request.step_rows = step_rows;
  return request;
}

TEST(ThreadPlan, BaseRunsOneModelThreadForSmallStepsAndAllBeyond) {
  for (int64_t rows : {1, 5, 40}) {
    const ThreadPlan plan = PlanThreads(Request("base", false, 2, rows));
    EXPECT_EQ(plan.model_threads, 1) << rows;
    EXPECT_FALSE(plan.interleave);
  }
  for (int64_t rows : {41, 80, 320}) {
    EXPECT_EQ(PlanThreads(Request("base", false, 2, rows)).model_threads, 2) << rows;
    EXPECT_EQ(PlanThreads(Request("base", false, 4, rows)).model_threads, 4) << rows;
  }
}

TEST(ThreadPlan, AutoInterleavesThroughTheRouterAndEmbeddedWithACoreToSpare) {
  for (const char* mode : {"knn", "subset-knn"}) {
    for (int64_t rows : {5, 80, 320}) {
      EXPECT_TRUE(PlanThreads(Request(mode, true, 1, rows)).interleave) << mode << " " << rows;
      EXPECT_TRUE(PlanThreads(Request(mode, true, 2, rows)).interleave) << mode << " " << rows;
      EXPECT_TRUE(PlanThreads(Request(mode, false, 2, rows)).interleave) << mode << " " << rows;
      // No core to spare.
      EXPECT_FALSE(PlanThreads(Request(mode, false, 1, rows)).interleave) << mode << " " << rows;
    }
  }
  for (const char* setting : {"on", "off"}) {
    ThreadRequest request = Request("knn", false, 2, 320);
    request.interleave = setting;
    EXPECT_EQ(PlanThreads(request).interleave, std::string(setting) == "on");
  }
}

// With the automatic settings, an embedded search that runs while the model computes shares the
// model's cores only from the background (idle priority): OpenMP teams on shared cores preempt
// each other at every barrier.
TEST(ThreadPlan, ConcurrentModelAndSearchShareCoresOnlyFromTheBackground) {
  for (const char* mode : {"knn", "subset-knn"}) {
    for (int threads : {1, 2, 3, 8}) {
      for (int64_t rows : {1, 5, 40, 41, 80, 160, 161, 320}) {
        const ThreadPlan plan = PlanThreads(Request(mode, false, threads, rows));
        SCOPED_TRACE(testing::Message() << mode << " threads " << threads << " rows " << rows);
        EXPECT_GE(plan.model_threads, 1);
        EXPECT_GE(plan.search_threads, 1);
        if (plan.background_search) {
          EXPECT_TRUE(plan.interleave);
          EXPECT_TRUE(plan.overlap);
          EXPECT_GT(rows, 160);
          EXPECT_EQ(plan.model_threads, threads);
          EXPECT_EQ(plan.search_threads, 1);
        } else if (plan.overlap) {
          EXPECT_LE(plan.model_threads + plan.search_threads, threads);
        } else {
          EXPECT_FALSE(plan.interleave);
          EXPECT_LE(plan.search_threads, threads);
        }
      }
    }
  }
  // Steps of up to 160 rows (batch 32 at beam 5): a one-thread search beside a one-thread model,
  // two batches in flight.
  for (const char* mode : {"knn", "subset-knn"}) {
    for (int64_t rows : {40, 80, 160}) {
      const ThreadPlan small = PlanThreads(Request(mode, false, 2, rows));
      EXPECT_TRUE(small.interleave) << mode << " " << rows;
      EXPECT_TRUE(small.overlap) << mode << " " << rows;
      EXPECT_FALSE(small.background_search) << mode << " " << rows;
      EXPECT_EQ(small.model_threads, 1) << mode << " " << rows;
      EXPECT_EQ(small.search_threads, 1) << mode << " " << rows;
    }
  }
  // Larger steps, two batches in flight: the model on every thread, a one-thread search in the
  // background.
  for (const char* mode : {"knn", "subset-knn"}) {
    const ThreadPlan large = PlanThreads(Request(mode, false, 2, 161));
    EXPECT_TRUE(large.interleave) << mode;
    EXPECT_TRUE(large.background_search) << mode;
    EXPECT_EQ(large.model_threads, 2) << mode;
    EXPECT_EQ(large.search_threads, 1) << mode;
  }
  // Large steps one batch at a time: the search runs after the model, on every thread.
  ThreadRequest one_batch = Request("subset-knn", false, 2, 320);
  one_batch.interleave = "off";
  const ThreadPlan after = PlanThreads(one_batch);
  EXPECT_FALSE(after.overlap);
  EXPECT_EQ(after.model_threads, 2);
  EXPECT_EQ(after.search_threads, 2);
}

// Through the router the servers' work is not the decoder's to plan; co-located with it, they
// need a core up to 80 query rows a step.
TEST(ThreadPlan, RemoteRunsOneModelThreadUpTo80RowsAndAllBeyond) {
  for (const char* mode : {"knn", "subset-knn"}) {
    for (int64_t rows : {1, 40, 41, 80}) {
      const ThreadPlan plan = PlanThreads(Request(mode, true, 2, rows));
      EXPECT_EQ(plan.model_threads, 1) << mode << " " << rows;
      EXPECT_FALSE(plan.background_search) << mode << " " << rows;
    }
    EXPECT_EQ(PlanThreads(Request(mode, true, 2, 81)).model_threads, 2) << mode;
    EXPECT_EQ(PlanThreads(Request(mode, true, 4, 320)).model_threads, 4) << mode;
    EXPECT_FALSE(PlanThreads(Request(mode, true, 2, 320)).background_search) << mode;
  }
}

TEST(ThreadPlan, ExplicitSearchThreadsAreKept) {
  ThreadRequest request = Request("subset-knn", false, 4, 320);
  request.search_threads = 3;
  ThreadPlan plan = PlanThreads(request);
  EXPECT_EQ(plan.search_threads, 3);
  EXPECT_TRUE(plan.overlap);
  EXPECT_EQ(plan.model_threads, 1);
  request.interleave = "on";
  request.search_threads = 1;
  plan = PlanThreads(request);
  EXPECT_TRUE(plan.interleave);
  EXPECT_FALSE(plan.background_search);
  EXPECT_EQ(plan.search_threads, 1);
  EXPECT_EQ(plan.model_threads, 3);
}

}  // namespace
}  // namespace knnserve::knn
