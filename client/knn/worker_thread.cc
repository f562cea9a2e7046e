#include "client/knn/worker_thread.h"

#include <utility>

namespace knnserve::knn {
namespace {

bool Idle(bool* busy) { return !*busy; }

}  // namespace

WorkerThread::~WorkerThread() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(Idle, &busy_));
    stop_ = true;
  }
  thread_.join();
}

void WorkerThread::Post(std::function<void()> job) {
  {
    absl::MutexLock lock(&mu_);
    job_ = std::move(job);
    busy_ = true;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void WorkerThread::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(Idle, &busy_));
}

void WorkerThread::Loop() {
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerThread* w)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->stop_ || w->job_ != nullptr; },
          this));
      if (stop_) return;
      job = std::exchange(job_, nullptr);
    }
    job();
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }
}

}  // namespace knnserve::knn
