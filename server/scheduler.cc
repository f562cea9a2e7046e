#include "server/scheduler.h"

#include <utility>

#include "absl/time/clock.h"

namespace knnserve {

Scheduler::Scheduler() : thread_([this] { Run(); }) {}

Scheduler::~Scheduler() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.Signal();
  }
  thread_.join();
}

void Scheduler::Schedule(absl::Time when, std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  pending_.emplace(when, std::move(callback));
  wake_.Signal();
}

void Scheduler::Run() {
  mu_.Lock();
  while (!stop_) {
    if (pending_.empty()) {
      wake_.Wait(&mu_);
      continue;
    }
    auto next = pending_.begin();
    if (next->first > absl::Now()) {
      wake_.WaitWithDeadline(&mu_, next->first);
      continue;
    }
    std::function<void()> callback = std::move(next->second);
    pending_.erase(next);
    mu_.Unlock();
    callback();
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace knnserve
