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
  // Linux SCHED_IDLE while no owner waits: the worker runs only on a core that has nothing else
  // to run, so that it shares cores with the model's threads without ever preempting them. While
  // any owner in the process waits in Wait(), every idle-priority worker runs at normal priority
  // (a job that began meanwhile from then on; one already running when the wait began is raised
  // at once): at idle priority a worker would get almost no CPU from a machine that other
  // processes keep busy, and the owner would wait for it, or for a lock that it holds, all that
  // time (a decoder beside two busy loops did not finish 200 sentences in 150 s, against 10 s
  // for base MT). Where the process may not leave SCHED_IDLE again (IdlePriorityReversible), and
  // off Linux, the worker runs at normal priority throughout. An idle worker's jobs run their
  // OpenMP regions on one thread (its OpenMP thread count is 1): threads it started would stay
  // at idle priority while it is raised.
  kIdle,
};

// Whether a thread at nice `nice` may leave SCHED_IDLE for SCHED_OTHER (Linux's rule for
// unprivileged threads): with CAP_SYS_NICE, or when RLIMIT_NICE (its soft limit `nice_limit`)
// allows that nice value, i.e. nice_limit >= 20 - nice.
bool IdlePriorityReversible(bool cap_sys_nice, long nice_limit, int nice);

// Thread-compatible: one owning thread calls Post and Wait. The thread starts with the first
// Post; the destructor waits for the posted jobs and joins it.
class WorkerThread {
 public:
  explicit WorkerThread(WorkerPriority priority = WorkerPriority::kNormal);
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;
  ~WorkerThread();

  // Runs `job` on the worker after the jobs posted before it.
  void Post(std::function<void()> job);
  // Blocks until every posted job has returned; returns at once when idle. Idle-priority
  // workers run at normal priority meanwhile (WorkerPriority::kIdle).
  void Wait();

 private:
  void Loop();

  // Whether the worker drops to SCHED_IDLE while no owner waits.
  const bool idle_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);  // not yet taken
  int unfinished_ ABSL_GUARDED_BY(mu_) = 0;                      // posted, not yet returned
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_WORKER_THREAD_H_
