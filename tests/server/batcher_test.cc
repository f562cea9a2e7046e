#include "shard/batcher.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/flat_engine.h"
#include "tests/server/test_cluster.h"

namespace knnserve {
namespace {

using ::knnserve::testing::ControlledEngine;
using ::knnserve::testing::FlatEngine;
using ::knnserve::testing::MakeDatastore;
using ::knnserve::testing::RandomQueries;
using ::knnserve::testing::StatusIs;

constexpr int kDim = 8;

// A submitted call and its answer.
struct Outcome {
  absl::Notification done;
  absl::StatusOr<EngineResult> result;
};

class BatcherTest : public ::testing::Test {
 protected:
  BatcherTest()
      : engine_(std::make_unique<FlatEngine>(MakeDatastore(60, kDim, 5, 1), 0, 60)),
        batcher_(&engine_, {absl::Milliseconds(1), 1024, /*num_threads=*/1}, &metrics_) {}

  SearchCall Call(int rows, int k, uint32_t seed) {
    SearchCall call;
    call.query.queries = RandomQueries(rows, kDim, seed);
    call.query.params.k = k;
    return call;
  }

  std::shared_ptr<Outcome> Submit(SearchCall call) {
    auto outcome = std::make_shared<Outcome>();
    batcher_.Submit(std::move(call), [outcome](absl::StatusOr<EngineResult> result) {
      outcome->result = std::move(result);
      outcome->done.Notify();
    });
    return outcome;
  }

  // Holds the single worker inside the engine so that later submissions queue up.
  std::shared_ptr<Outcome> OccupyWorker() {
    engine_.CloseGate();
    auto first = Submit(Call(1, 3, 99));
    EXPECT_TRUE(engine_.WaitForCallsAtGate(1, absl::Seconds(10)));
    return first;
  }

  static void Wait(const std::shared_ptr<Outcome>& outcome) {
    ASSERT_TRUE(outcome->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }

  MetricsRegistry metrics_;
  ControlledEngine engine_;
  Batcher batcher_;
};

TEST_F(BatcherTest, CoalescesQueuedRequestsWithEqualParamsIntoOneEngineCall) {
  auto first = OccupyWorker();
  std::vector<SearchCall> calls;
  std::vector<std::shared_ptr<Outcome>> outcomes;
  for (int i = 0; i < 5; ++i) {
    calls.push_back(Call(1 + i, 4, i));
    outcomes.push_back(Submit(calls.back()));
  }
  engine_.OpenGate();
  Wait(first);
  for (const auto& outcome : outcomes) Wait(outcome);
  EXPECT_EQ(engine_.calls(), 2);  // the first call, then one for all five
  for (size_t i = 0; i < calls.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(EngineResult alone, engine_.Search(calls[i].query));
    ASSERT_THAT(outcomes[i]->result, ::knnserve::testing::IsOk());
    EXPECT_EQ(outcomes[i]->result->neighbors.rows, 1 + static_cast<int64_t>(i));
    EXPECT_EQ(outcomes[i]->result->neighbors.ids, alone.neighbors.ids);
    EXPECT_EQ(outcomes[i]->result->neighbors.distances, alone.neighbors.distances);
    EXPECT_EQ(outcomes[i]->result->neighbors.values, alone.neighbors.values);
  }
}

// With two workers: while the running call leaves a core free, the next request starts at once
// (however long max_wait); when the running calls take every core, it waits for company and
// is coalesced with the request that comes next.
TEST(BatcherCores, WaitsForCompanyOnlyWhenRunningCallsTakeEveryCore) {
  for (const int cores : {2, 1}) {
    SCOPED_TRACE(absl::StrCat(cores, " cores"));
    MetricsRegistry metrics;
    ControlledEngine engine(std::make_unique<FlatEngine>(MakeDatastore(60, kDim, 5, 1), 0, 60));
    BatcherOptions options{absl::Seconds(30), /*max_batch_rows=*/2, /*num_threads=*/2,
                           /*engine_threads=*/1, cores};
    Batcher batcher(&engine, options, &metrics);
    std::vector<std::shared_ptr<Outcome>> outcomes;
    auto submit = [&](uint32_t seed) {
      auto outcome = std::make_shared<Outcome>();
      SearchCall call;
      call.query.queries = RandomQueries(1, kDim, seed);
      call.query.params.k = 3;
      batcher.Submit(std::move(call), [outcome](absl::StatusOr<EngineResult> result) {
        outcome->result = std::move(result);
        outcome->done.Notify();
      });
      outcomes.push_back(outcome);
    };
    engine.CloseGate();
    submit(1);
    ASSERT_TRUE(engine.WaitForCallsAtGate(1, absl::Seconds(10)));
    submit(2);
    if (cores == 2) {
      EXPECT_TRUE(engine.WaitForCallsAtGate(2, absl::Seconds(10)));  // not 30 s of waiting
    } else {
      EXPECT_FALSE(engine.WaitForCallsAtGate(2, absl::Milliseconds(300)));
      submit(3);  // two rows: the waiting batch is full and runs
      EXPECT_TRUE(engine.WaitForCallsAtGate(2, absl::Seconds(10)));
    }
    engine.OpenGate();
    for (const auto& outcome : outcomes) {
      ASSERT_TRUE(outcome->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
      EXPECT_THAT(outcome->result, ::knnserve::testing::IsOk());
    }
    EXPECT_EQ(engine.calls(), 2);
  }
}

TEST_F(BatcherTest, KeepsDifferentParamsAndSubsetSearchesApart) {
  auto first = OccupyWorker();
  SearchCall subset = Call(2, 4, 3);
  subset.query.subset_groups = std::make_shared<const SubsetGroups>(SubsetGroups{{1, 2}, {5}});
  subset.query.row_group = {0, 1};
  std::vector<std::shared_ptr<Outcome>> outcomes = {Submit(Call(1, 4, 1)), Submit(Call(1, 5, 2)),
                                                    Submit(std::move(subset))};
  engine_.OpenGate();
  Wait(first);
  for (const auto& outcome : outcomes) {
    Wait(outcome);
    EXPECT_THAT(outcome->result, ::knnserve::testing::IsOk());
  }
  EXPECT_EQ(engine_.calls(), 4);
}

TEST_F(BatcherTest, DropsCancelledAndExpiredRequestsWithoutSearching) {
  auto first = OccupyWorker();
  SearchCall cancelled = Call(1, 4, 1);
  cancelled.cancel->Cancel();
  SearchCall expired = Call(1, 4, 2);
  expired.deadline = absl::Now();
  auto cancelled_outcome = Submit(std::move(cancelled));
  auto expired_outcome = Submit(std::move(expired));
  engine_.OpenGate();
  Wait(first);
  Wait(cancelled_outcome);
  Wait(expired_outcome);
  EXPECT_THAT(cancelled_outcome->result, StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  EXPECT_THAT(expired_outcome->result, StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  EXPECT_EQ(engine_.calls(), 1);
}

}  // namespace
}  // namespace knnserve
