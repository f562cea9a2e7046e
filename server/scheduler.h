// Runs callbacks at given times on one background thread (hedge timers). gRPC C++ has no timer
// that is safe to destroy from its own callback; this one is.
#ifndef KNNSERVE_SERVER_SCHEDULER_H_
#define KNNSERVE_SERVER_SCHEDULER_H_

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace knnserve {

// Thread-safe. Callbacks must be short (they run on the scheduler's thread, one at a time);
// the destructor drops callbacks that have not run.
class Scheduler {
 public:
  Scheduler();
  ~Scheduler();

  void Schedule(absl::Time when, std::function<void()> callback);

 private:
  void Run();

  absl::Mutex mu_;
  absl::CondVar wake_;
  std::multimap<absl::Time, std::function<void()>> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace knnserve

#endif  // KNNSERVE_SERVER_SCHEDULER_H_
