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

// How the worker competes for CPU with the rest of the process.
enum class WorkerPriority {
  kNormal,
  // Linux SCHED_IDLE: the worker runs only on a core that has nothing else to run, so that it
  // can share cores with the model's threads without ever preempting them (elsewhere: normal).
  kIdle,
};

// Thread-compatible: one owning thread calls Post and Wait. The thread starts with the first
// Post; the destructor waits for the posted jobs and joins it.
class WorkerThread {
 public:
  explicit WorkerThread(WorkerPriority priority = WorkerPriority::kNormal) : priority_(priority) {}
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;
  ~WorkerThread();

  // Runs `job` on the worker after the jobs posted before it.
  void Post(std::function<void()> job);
  // Blocks until every posted job has returned; returns at once when idle.
  void Wait();

 private:
  void Loop();

  const WorkerPriority priority_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);  // not yet taken
  int unfinished_ ABSL_GUARDED_BY(mu_) = 0;                      // posted, not yet returned
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_WORKER_THREAD_H_
