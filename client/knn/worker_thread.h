// A thread that runs its owner's jobs one at a time, in the order posted: the kNN-MT batch setup
// and step searches run there while the decoder computes the model's log-probabilities.
#ifndef KNNSERVE_CLIENT_KNN_WORKER_THREAD_H_
#define KNNSERVE_CLIENT_KNN_WORKER_THREAD_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace knnserve::knn {

// Thread-compatible: one owning thread calls Post and Wait. The thread starts with the first
// Post; the destructor waits for the posted jobs and joins it.
class WorkerThread {
 public:
  WorkerThread() = default;
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;
  ~WorkerThread();

  // Runs `job` on the worker after the jobs posted before it.
  void Post(std::function<void()> job);
  // Blocks until every posted job has returned; returns at once when idle.
  void Wait();

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);  // not yet taken
  int unfinished_ ABSL_GUARDED_BY(mu_) = 0;                      // posted, not yet returned
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_WORKER_THREAD_H_
