#include "client/knn/worker_thread.h"

#include <omp.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

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

// The process's idle-priority workers and the owners waiting for any worker. Every idle worker
// runs at normal priority while some owner waits, not only the one waited for: the workers share
// locks (e.g. SubsetAdc's packed-subset cache), and a raised worker blocked on a lock that an
// idle one held waited for it as long as before (subset kNN-MT's two interleaved batches beside
// two busy loops: 90 s with the decoder waiting 68 s, one worker raised and blocked in
// SubsetAdc::Packed, the other at SCHED_IDLE holding the cache's mutex).
// Thread-safe.
class IdleWorkers {
 public:
  static IdleWorkers& Get() {
    // Never destroyed: workers may outlive main.
    static IdleWorkers* const workers = new IdleWorkers;
    return *workers;
  }

  void Join(pid_t tid) {
    absl::MutexLock lock(&mu_);
    tids_.push_back(tid);
  }
  void Leave(pid_t tid) {
    absl::MutexLock lock(&mu_);
    tids_.erase(std::find(tids_.begin(), tids_.end(), tid));
  }

  // An owner begins to wait: every idle worker to normal priority, running jobs included.
  void BeginWait() {
    absl::MutexLock lock(&mu_);
    ++waiting_owners_;
    for (const pid_t tid : tids_) SetThreadPolicy(tid, SCHED_OTHER);
  }
  // The workers go back to idle priority with their next jobs.
  void EndWait() {
    absl::MutexLock lock(&mu_);
    --waiting_owners_;
  }

  // The calling worker before a job: idle priority unless an owner waits. Under the lock, so a
  // Wait that begins later raises the thread after this, never before.
  void SetPolicyForNextJob() {
    absl::MutexLock lock(&mu_);
    SetThreadPolicy(0, waiting_owners_ > 0 ? SCHED_OTHER : SCHED_IDLE);
  }

 private:
  absl::Mutex mu_;
  std::vector<pid_t> tids_ ABSL_GUARDED_BY(mu_);
  int waiting_owners_ ABSL_GUARDED_BY(mu_) = 0;
};
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
  if (unfinished_ == 0) return;
#ifdef SCHED_IDLE
  IdleWorkers::Get().BeginWait();
#endif
  mu_.Await(absl::Condition(Idle, &unfinished_));
#ifdef SCHED_IDLE
  IdleWorkers::Get().EndWait();
#endif
}

void WorkerThread::Loop() {
#ifdef SCHED_IDLE
  if (idle_) IdleWorkers::Get().Join(gettid());
#endif
  // Threads started by this one inherit its policy, and Wait raises the workers alone: an
  // OpenMP team of an idle worker's (LibTorch's ops in the subset selection opened one of two)
  // stayed at SCHED_IDLE, and on a busy machine the raised worker then waited at the team's
  // barriers much as before.
  if (idle_) omp_set_num_threads(1);
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerThread* w)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->stop_ || !w->jobs_.empty(); },
          this));
      if (stop_) break;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
#ifdef SCHED_IDLE
    if (idle_) IdleWorkers::Get().SetPolicyForNextJob();
#endif
    job();
    absl::MutexLock lock(&mu_);
    --unfinished_;
  }
#ifdef SCHED_IDLE
  if (idle_) IdleWorkers::Get().Leave(gettid());
#endif
}

}  // namespace knnserve::knn
