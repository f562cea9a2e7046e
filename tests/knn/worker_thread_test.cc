#include "client/knn/worker_thread.h"

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

}  // namespace
}  // namespace knnserve::knn
