#include "client/knn/worker_thread.h"

#include <sched.h>

#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace knnserve::knn {
namespace {

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

}  // namespace
}  // namespace knnserve::knn
