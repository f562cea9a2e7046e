#include "client/knn/worker_thread.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>
#include <utility>

namespace knnserve::knn {
namespace {

bool Idle(int* unfinished) { return *unfinished == 0; }

#ifdef SCHED_IDLE
// CAP_SYS_NICE in this process's effective capabilities (/proc/self/status, CapEff).
bool HasCapSysNice() {
  constexpr int kCapSysNice = 23;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    const unsigned long long caps = std::stoull(line.substr(7), nullptr, 16);
    return (caps >> kCapSysNice) & 1;
  }
  return false;
}

// Whether this process's threads may come back from SCHED_IDLE at their nice value.
bool CanLeaveIdlePriority() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NICE, &limit) != 0) limit.rlim_cur = 0;
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, 0);
  if (errno != 0) return false;
  return IdlePriorityReversible(HasCapSysNice(), static_cast<long>(limit.rlim_cur), nice);
}

// `tid` (0: the calling thread) to SCHED_IDLE or back to SCHED_OTHER. Applies to that thread
// only (Linux schedules threads) and to the threads it starts later, e.g. an OpenMP team.
// Where it fails the thread keeps its priority: other speed, same results.
void SetThreadPolicy(pid_t tid, int policy) {
  const sched_param param{};
  sched_setscheduler(tid, policy, &param);
}
#endif

}  // namespace

bool IdlePriorityReversible(bool cap_sys_nice, long nice_limit, int nice) {
  return cap_sys_nice || nice_limit >= 20 - nice;
}

WorkerThread::WorkerThread(WorkerPriority priority)
#ifdef SCHED_IDLE
    : idle_(priority == WorkerPriority::kIdle && CanLeaveIdlePriority())
#else
    : idle_(false)
#endif
{
}

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
#ifdef SCHED_IDLE
  // The worker's thread id is known once it took the lock; before that it has not lowered its
  // priority yet, and it checks boosted_ before it does.
  if (idle_ && unfinished_ > 0 && !boosted_) {
    boosted_ = true;
    if (worker_tid_ != 0) SetThreadPolicy(worker_tid_, SCHED_OTHER);
  }
#endif
  mu_.Await(absl::Condition(Idle, &unfinished_));
}

void WorkerThread::Loop() {
  {
    absl::MutexLock lock(&mu_);
    worker_tid_ = gettid();
  }
  bool lowered = false;  // whether this thread runs at SCHED_IDLE now
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
#ifdef SCHED_IDLE
      // Idle priority for jobs the owner does not wait for; Wait raised it (or will, under
      // this lock) for those it waits for.
      if (idle_ && lowered == boosted_) {
        SetThreadPolicy(0, boosted_ ? SCHED_OTHER : SCHED_IDLE);
        lowered = !boosted_;
      }
#endif
    }
    job();
    absl::MutexLock lock(&mu_);
    if (--unfinished_ == 0 && boosted_) {
      boosted_ = false;  // the owner's wait is over; the next job lowers the priority again
      lowered = false;   // Wait set SCHED_OTHER on this thread (or it never lowered it)
    }
  }
}

}  // namespace knnserve::knn
