#include "client/knn/worker_thread.h"

#include <sched.h>

#include <utility>

namespace knnserve::knn {
namespace {

bool Idle(int* unfinished) { return *unfinished == 0; }

// Applies to the calling thread only (Linux schedules threads), and to the threads it starts,
// e.g. an OpenMP team of the search's. Where it fails the worker keeps the normal priority:
// slower decoding, same results.
void SetCallingThreadPriority(WorkerPriority priority) {
#ifdef SCHED_IDLE
  if (priority == WorkerPriority::kIdle) {
    const sched_param param{};
    sched_setscheduler(0, SCHED_IDLE, &param);
  }
#endif
}

}  // namespace

WorkerThread::~WorkerThread() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(Idle, &unfinished_));
    stop_ = true;
  }
  thread_.join();
}

void WorkerThread::Post(std::function<void()> job) {
  {
    absl::MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
    ++unfinished_;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void WorkerThread::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(Idle, &unfinished_));
}

void WorkerThread::Loop() {
  SetCallingThreadPriority(priority_);
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerThread* w)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->stop_ || !w->jobs_.empty(); },
          this));
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
    absl::MutexLock lock(&mu_);
    --unfinished_;
  }
}

}  // namespace knnserve::knn
