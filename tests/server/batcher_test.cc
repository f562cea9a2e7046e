#include "shard/batcher.h"

#include <memory>
#include <set>
#include <thread>
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
// Queued query bytes are bounded: beyond max_queued_bytes a request is answered UNAVAILABLE at
// once, and the queue takes requests again once a worker has taken what waited.
TEST(BatcherQueue, RefusesRequestsBeyondTheQueuedBytes) {
  MetricsRegistry metrics;
  ControlledEngine engine(std::make_unique<FlatEngine>(MakeDatastore(60, kDim, 5, 1), 0, 60));
  BatcherOptions options{absl::ZeroDuration(), 1024, /*num_threads=*/1};
  options.inline_budget = absl::ZeroDuration();
  const auto query = [](int rows, uint32_t seed) {
    SearchQuery q;
    q.queries = RandomQueries(rows, kDim, seed);
    q.params.k = 3;
    return q;
  };
  options.max_queued_bytes = 2 * QueuedBytes(query(4, 0));  // two requests of 4 rows
  Batcher batcher(&engine, options, &metrics);
  std::vector<std::shared_ptr<Outcome>> outcomes;
  const auto submit = [&](int rows) {
    SearchCall call;
    call.query = query(rows, static_cast<uint32_t>(outcomes.size()));
    auto outcome = std::make_shared<Outcome>();
    batcher.Submit(std::move(call), [outcome](absl::StatusOr<EngineResult> result) {
      outcome->result = std::move(result);
      outcome->done.Notify();
    });
    outcomes.push_back(outcome);
    return outcome;
  };
  engine.CloseGate();
  submit(4);  // taken by the worker, held at the gate
  ASSERT_TRUE(engine.WaitForCallsAtGate(1, absl::Seconds(10)));
  submit(4);
  submit(4);  // the queue holds its bound
  const auto refused = submit(1);
  ASSERT_TRUE(refused->done.HasBeenNotified());
  EXPECT_THAT(refused->result,
              StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("shard overloaded")));
  engine.OpenGate();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(outcomes[i]->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(outcomes[i]->result.ok()) << outcomes[i]->result.status();
  }
  const auto later = submit(4);
  ASSERT_TRUE(later->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(later->result.ok()) << later->result.status();
}

// A waiting request is charged what it holds and will hold: a one-row request that declares a
// million sentence ids or asks for 1,024 neighbours weighs more than its 64 query floats. Groups
// kept under a session are charged to the session store instead.
TEST(BatcherQueue, ChargesDeclaredSubsetIdsAndTheAnswerToTheQueue) {
  SearchQuery query;
  query.queries = RandomQueries(1, kDim, 1);
  query.params.k = 1024;
  const int64_t answer = 1024 * (sizeof(float) + sizeof(int64_t) + sizeof(int32_t));
  EXPECT_EQ(QueuedBytes(query), kDim * 4 + answer);
  query.subset_groups = std::make_shared<const SubsetGroups>(
      SubsetGroups{std::vector<int64_t>(1 << 20), std::vector<int64_t>(5)});
  query.row_group = {0};
  query.declares_groups = true;
  EXPECT_EQ(QueuedBytes(query), kDim * 4 + answer + ((1 << 20) + 5) * 8);
  query.declares_groups = false;  // kept under a subset_session
  EXPECT_EQ(QueuedBytes(query), kDim * 4 + answer);
}

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

// Which threads made the engine calls.
class ThreadRecordingEngine : public SearchEngine {
 public:
  explicit ThreadRecordingEngine(const SearchEngine* inner) : inner_(inner) {}
  const EngineInfo& info() const override { return inner_->info(); }
  absl::StatusOr<EngineResult> Search(const SearchQuery& query) const override {
    {
      absl::MutexLock lock(&mu_);
      threads_.insert(std::this_thread::get_id());
    }
    return inner_->Search(query);
  }
  size_t threads() const {
    absl::MutexLock lock(&mu_);
    return threads_.size();
  }

 private:
  const SearchEngine* const inner_;
  mutable absl::Mutex mu_;
  mutable std::set<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
};

// Requests that find the shard idle all run on the first worker, whose core and thread-local
// scratch stay warm; another worker joins only while the ones before it are busy.
TEST(BatcherWorkers, LoneRequestsStayOnTheFirstWorker) {
  MetricsRegistry metrics;
  ControlledEngine gated(std::make_unique<FlatEngine>(MakeDatastore(60, kDim, 5, 1), 0, 60));
  ThreadRecordingEngine engine(&gated);
  BatcherOptions options{absl::Milliseconds(1), 1024, /*num_threads=*/3, /*engine_threads=*/1,
                         /*cores=*/4};
  options.inline_budget = absl::ZeroDuration();  // every call on a worker
  Batcher batcher(&engine, options, &metrics);
  auto submit = [&](int k, uint32_t seed) {
    auto outcome = std::make_shared<Outcome>();
    SearchCall call;
    call.query.queries = RandomQueries(1, kDim, seed);
    call.query.params.k = k;
    batcher.Submit(std::move(call), [outcome](absl::StatusOr<EngineResult> result) {
      outcome->result = std::move(result);
      outcome->done.Notify();
    });
    return outcome;
  };
  auto wait = [](const std::shared_ptr<Outcome>& outcome) {
    ASSERT_TRUE(outcome->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_THAT(outcome->result, ::knnserve::testing::IsOk());
  };
  for (uint32_t i = 0; i < 20; ++i) wait(submit(3, i));  // one at a time
  EXPECT_EQ(engine.threads(), 1u);
  // Two at once (different k: not coalesced): the second worker takes the second.
  gated.CloseGate();
  auto first = submit(3, 100);
  ASSERT_TRUE(gated.WaitForCallsAtGate(1, absl::Seconds(10)));
  auto second = submit(4, 101);
  EXPECT_TRUE(gated.WaitForCallsAtGate(2, absl::Seconds(10)));
  gated.OpenGate();
  wait(first);
  wait(second);
  EXPECT_EQ(engine.threads(), 2u);
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

// Where each answer was delivered, and whether before Submit returned.
struct Delivery {
  std::thread::id thread;
  bool before_return = false;
  absl::StatusOr<EngineResult> result;
};

Delivery SubmitAndWait(Batcher& batcher, SearchCall call) {
  auto delivery = std::make_shared<Delivery>();
  auto done = std::make_shared<absl::Notification>();
  batcher.Submit(std::move(call), [delivery, done](absl::StatusOr<EngineResult> result) {
    delivery->thread = std::this_thread::get_id();
    delivery->result = std::move(result);
    done->Notify();
  });
  delivery->before_return = done->HasBeenNotified();
  EXPECT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(10)));
  return *delivery;
}

SearchCall OneRowCall(uint32_t seed) {
  SearchCall call;
  call.query.queries = RandomQueries(1, kDim, seed);
  call.query.params.k = 3;
  return call;
}

// The first request runs on a worker (the engine's cost is unknown); once known to fit the
// budget, a request on the idle shard runs on the calling thread, with the same answer.
TEST(BatcherInline, RunsASmallRequestOnTheCallingThreadOnceItsCostIsKnown) {
  MetricsRegistry metrics;
  FlatEngine engine(MakeDatastore(60, kDim, 5, 1), 0, 60);
  BatcherOptions options;
  options.inline_budget = absl::Seconds(10);
  options.cores = 2;  // a core stays free while the first call's worker winds down
  Batcher batcher(&engine, options, &metrics);
  const Delivery first = SubmitAndWait(batcher, OneRowCall(1));
  EXPECT_NE(first.thread, std::this_thread::get_id());
  const Delivery second = SubmitAndWait(batcher, OneRowCall(2));
  EXPECT_EQ(second.thread, std::this_thread::get_id());
  EXPECT_TRUE(second.before_return);
  ASSERT_OK_AND_ASSIGN(EngineResult alone, engine.Search(OneRowCall(2).query));
  ASSERT_THAT(second.result, ::knnserve::testing::IsOk());
  EXPECT_EQ(second.result->neighbors.ids, alone.neighbors.ids);
  EXPECT_EQ(second.result->neighbors.distances, alone.neighbors.distances);
}

// Over budget (or with inlining off) requests go to a worker; so do requests arriving while
// the running calls take every core, which queue behind them.
TEST(BatcherInline, HandsOffOverBudgetAndWhenNoCoreIsFree) {
  for (const absl::Duration budget : {absl::ZeroDuration(), absl::Nanoseconds(1)}) {
    MetricsRegistry metrics;
    FlatEngine engine(MakeDatastore(60, kDim, 5, 1), 0, 60);
    BatcherOptions options;
    options.inline_budget = budget;
    Batcher batcher(&engine, options, &metrics);
    SubmitAndWait(batcher, OneRowCall(1));
    const Delivery second = SubmitAndWait(batcher, OneRowCall(2));
    EXPECT_NE(second.thread, std::this_thread::get_id()) << budget;
  }
  MetricsRegistry metrics;
  ControlledEngine engine(std::make_unique<FlatEngine>(MakeDatastore(60, kDim, 5, 1), 0, 60));
  BatcherOptions options;
  options.inline_budget = absl::Seconds(10);
  options.num_threads = 1;
  options.cores = 1;
  Batcher batcher(&engine, options, &metrics);
  SubmitAndWait(batcher, OneRowCall(1));  // the cost is known now
  engine.CloseGate();
  // Runs inline on its own thread and holds the only core at the gate.
  std::thread holder([&batcher] { SubmitAndWait(batcher, OneRowCall(2)); });
  ASSERT_TRUE(engine.WaitForCallsAtGate(1, absl::Seconds(10)));
  auto queued = std::make_shared<absl::Notification>();
  batcher.Submit(OneRowCall(3), [queued](absl::StatusOr<EngineResult>) { queued->Notify(); });
  EXPECT_FALSE(queued->HasBeenNotified());
  engine.OpenGate();
  holder.join();
  EXPECT_TRUE(queued->WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(engine.calls(), 3);
}

}  // namespace
}  // namespace knnserve
