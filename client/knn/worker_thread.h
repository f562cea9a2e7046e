// A thread that runs its owner's jobs one at a time: the kNN-MT step search runs there while the
// decoder computes the model's log-probabilities.
#ifndef KNNSERVE_CLIENT_KNN_WORKER_THREAD_H_
#define KNNSERVE_CLIENT_KNN_WORKER_THREAD_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace knnserve::knn {

// Thread-compatible: one owning thread calls Post and Wait. The thread starts with the first
// Post; the destructor waits for the posted job and joins it.
class WorkerThread {
 public:
  WorkerThread() = default;
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;
  ~WorkerThread();

  // Runs `job` on the worker. REQUIRES: idle (every earlier Post was followed by a Wait).
  void Post(std::function<void()> job);
  // Blocks until the posted job has returned; returns at once when idle.
  void Wait();

 private:
  void Loop();

  absl::Mutex mu_;
  std::function<void()> job_ ABSL_GUARDED_BY(mu_);  // set until the worker takes it
  bool busy_ ABSL_GUARDED_BY(mu_) = false;          // posted and not yet returned
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_WORKER_THREAD_H_
