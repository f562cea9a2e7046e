#include "client/knn/worker_thread.h"

#include <omp.h>
#include <sched.h>

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace knnserve::knn {
namespace {

// Whether this process may raise a thread from SCHED_IDLE again (root, or CAP_SYS_NICE, or a
// high enough RLIMIT_NICE): an idle-priority worker is idle only then.
bool CanLeaveIdle() {
  const int before = sched_getscheduler(0);
  bool can = false;
  std::thread probe([&can] {
    const sched_param param{};
    can = sched_setscheduler(0, SCHED_IDLE, &param) == 0 &&
          sched_setscheduler(0, SCHED_OTHER, &param) == 0;
  });
  probe.join();
  EXPECT_EQ(sched_getscheduler(0), before);
  return can;
}

// The processor queues a batch's setup and then its first step's search without waiting in
// between: the search must see what the setup did.
TEST(WorkerThread, RunsQueuedJobsInOrderAndWaitCoversThemAll) {
  WorkerThread worker;
  std::vector<int> order;  // written by the worker only, read after Wait
  absl::Notification release;
  worker.Post([&] {
    release.WaitForNotification();  // the next jobs queue up behind this one
    order.push_back(1);
  });
  for (int job = 2; job <= 4; ++job) worker.Post([&order, job] { order.push_back(job); });
  release.Notify();
  worker.Wait();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 4}));
  worker.Post([&] { order.push_back(5); });
  worker.Wait();
  EXPECT_EQ(order.back(), 5);
}

// The background search takes only what the model's threads leave: its worker runs at idle
// priority, and the owner's thread keeps its own.
TEST(WorkerThread, IdlePriorityAppliesToTheWorkerAlone) {
  if (!CanLeaveIdle()) GTEST_SKIP() << "this process may not leave SCHED_IDLE: normal priority";
  const int owner_policy = sched_getscheduler(0);
  int normal_policy = -1;
  int idle_policy = -1;
  {
    WorkerThread normal;
    normal.Post([&] { normal_policy = sched_getscheduler(0); });
    WorkerThread idle(WorkerPriority::kIdle);
    idle.Post([&] { idle_policy = sched_getscheduler(0); });
  }
  EXPECT_EQ(normal_policy, owner_policy);
  EXPECT_EQ(idle_policy, SCHED_IDLE);
  EXPECT_EQ(sched_getscheduler(0), owner_policy);
}

// While its owner waits, an idle-priority worker runs at normal priority (on a machine that
// other processes keep busy, SCHED_IDLE would get it almost no CPU, and the owner would wait all
// that time), for every job the wait covers; jobs posted afterwards run at idle priority again.
TEST(WorkerThread, AnIdleWorkerRunsAtNormalPriorityWhileItsOwnerWaits) {
  if (!CanLeaveIdle()) GTEST_SKIP() << "this process may not leave SCHED_IDLE: normal priority";
  WorkerThread worker(WorkerPriority::kIdle);
  absl::Notification started;
  std::vector<int> policies;  // written by the worker only, read after Wait
  worker.Post([&] {
    policies.push_back(sched_getscheduler(0));
    started.Notify();
    // Until the owner's Wait raised this thread (a bound, not a timing: the loop fails the test
    // only if the raise never comes).
    for (int i = 0; i < 100000 && sched_getscheduler(0) == SCHED_IDLE; ++i)
      absl::SleepFor(absl::Microseconds(100));
    policies.push_back(sched_getscheduler(0));
  });
  worker.Post([&] { policies.push_back(sched_getscheduler(0)); });  // queued behind it
  started.WaitForNotification();
  worker.Wait();
  absl::Notification ran;  // awaited without Wait: the owner does not wait for the worker
  worker.Post([&] {
    policies.push_back(sched_getscheduler(0));
    ran.Notify();
  });
  ran.WaitForNotification();
  worker.Wait();
  ASSERT_EQ(policies.size(), 4u);
  EXPECT_EQ(policies[0], SCHED_IDLE);   // posted, not waited for
  EXPECT_EQ(policies[1], SCHED_OTHER);  // raised by Wait mid-job
  EXPECT_EQ(policies[2], SCHED_OTHER);  // the next job of the same wait
  EXPECT_EQ(policies[3], SCHED_IDLE);   // after the wait, not waited for
}

// Workers share locks (SubsetAdc's packed-subset cache): while an owner waits for its worker,
// the other idle workers run at normal priority too, or one holding a lock that the awaited
// worker needs would keep it waiting.
TEST(WorkerThread, EveryIdleWorkerRunsAtNormalPriorityWhileAnyOwnerWaits) {
  if (!CanLeaveIdle()) GTEST_SKIP() << "this process may not leave SCHED_IDLE: normal priority";
  WorkerThread awaited(WorkerPriority::kIdle);
  WorkerThread other(WorkerPriority::kIdle);
  absl::Notification other_started;
  absl::Notification other_raised;
  int other_policy_before = -1;
  int other_policy_raised = -1;
  other.Post([&] {
    other_policy_before = sched_getscheduler(0);
    other_started.Notify();
    // Bounded: the test fails, not hangs, if the raise never comes.
    for (int i = 0; i < 100000 && sched_getscheduler(0) == SCHED_IDLE; ++i)
      absl::SleepFor(absl::Microseconds(100));
    other_policy_raised = sched_getscheduler(0);
    other_raised.Notify();
  });
  other_started.WaitForNotification();
  // The awaited worker's job ends only once the other worker was raised (or its bound ran out).
  awaited.Post([&] { other_raised.WaitForNotification(); });
  awaited.Wait();
  other.Wait();
  EXPECT_EQ(other_policy_before, SCHED_IDLE);
  EXPECT_EQ(other_policy_raised, SCHED_OTHER);
  int other_policy_after = -1;
  absl::Notification ran;  // not awaited with Wait: nobody waits, idle priority again
  other.Post([&] {
    other_policy_after = sched_getscheduler(0);
    ran.Notify();
  });
  ran.WaitForNotification();
  EXPECT_EQ(other_policy_after, SCHED_IDLE);
  other.Wait();
}

// A thread that an idle worker's job started (an OpenMP team's) would inherit SCHED_IDLE, and Wait
// raises the worker alone: on a busy machine the worker would then wait for that thread.
TEST(WorkerThread, AnIdleWorkerOpensOneThreadParallelRegions) {
  if (!CanLeaveIdle()) GTEST_SKIP() << "this process may not leave SCHED_IDLE: normal priority";
  WorkerThread worker(WorkerPriority::kIdle);
  int team = 0;
  worker.Post([&team] {
#pragma omp parallel
    {
#pragma omp single
      team = omp_get_num_threads();
    }
  });
  worker.Wait();
  EXPECT_EQ(team, 1);
}

TEST(IdlePriorityReversible, FollowsLinuxRuleForUnprivilegedThreads) {
  EXPECT_TRUE(IdlePriorityReversible(/*cap_sys_nice=*/true, /*nice_limit=*/0, /*nice=*/0));
  EXPECT_FALSE(IdlePriorityReversible(false, 0, 0));  // Debian's default RLIMIT_NICE
  EXPECT_TRUE(IdlePriorityReversible(false, 20, 0));
  EXPECT_FALSE(IdlePriorityReversible(false, 19, 0));
  EXPECT_TRUE(IdlePriorityReversible(false, 1, 19));  // a process started at nice 19
}

}  // namespace
}  // namespace knnserve::knn
