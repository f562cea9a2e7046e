#include "client/knn/thread_plan.h"

#include <algorithm>

namespace knnserve::knn {
namespace {

// Up to this many query rows per step (batch x beam), the embedded full search runs on one
// thread beside the model's. Measured on 2 cores, beam 5, interleaved: overlapping the full
// search paid at batch 1 and 16 (1.06-1.31x), where neither it nor the model's products keep
// both cores busy, and cost at batch 64 (the threads contend). Overlapping the subset search
// within a step cost at batch 16 (0.87-0.89x) and was neutral at batch 1.
constexpr int64_t kOverlapStepRows = 80;

// Up to this many query rows per step (batch x beam), the model runs on one thread: its products
// are too small for a second OpenMP thread to repay the synchronization on these machines.
// Measured with base MT on 2 cores (200 office sentences, beam 5, two rounds), --threads 1
// against 2: 360 / 382 against 319 / 322 tokens/s at batch 1, 760 / 768 against 675 / 691 at
// batch 4, 889 / 903 against 882 / 871 at batch 8; at batch 16 level (966 / 959 against
// 1035 / 823), at batch 64 two threads are ~1.2x faster.
constexpr int64_t kOneModelThreadStepRows = 40;

}  // namespace

// Interleaving pays where the retrieval does not take the model's cores. Through the demo's
// router and shards on 2 cores, with the decoder at --threads 1 (the servers take the other
// core; 300 office sentences, beam 5, two rounds), it took kNN-MT at batch 16 from 656 / 621 to
// 743 / 692 tokens/s and subset kNN-MT from 660 / 583 to 828 / 640 (at batch 64 level: 712 vs
// 709, 787 vs 783) against --threads 2 one batch at a time. Embedded, the search runs on cores
// the model would use: beside a model at --threads 2 every search and the model's parallel
// regions preempt each other (subset kNN-MT, batch 64: 2.64-2.69 s against 2.39-2.55 s), and
// beside a one-thread model at batch 16 it cost too (797 / 757 -> 764 / 723 tokens/s). Where
// the model keeps to one thread anyway (kOneModelThreadStepRows), embedded subset kNN-MT
// interleaves with the search on the other threads: 463 / 474 -> 608 / 603 tokens/s at batch 4
// (base 622 / 619 at --threads 2), 227 / 224 -> 279 / 314 at batch 1, 669 / 650 -> 702 / 676 at
// batch 8 (those runs still let the subset selection reset the model to two threads).
ThreadPlan PlanThreads(const ThreadRequest& request) {
  const int threads = request.threads;
  const int64_t step_rows = request.step_rows;
  ThreadPlan plan;
  const bool small_steps = step_rows <= kOneModelThreadStepRows;
  plan.model_threads = small_steps ? 1 : threads;
  if (request.mode == "base") return plan;
  const bool embedded = !request.remote;
  plan.interleave = request.interleave == "auto"
                        ? !embedded || (request.mode == "subset-knn" && threads >= 2 && small_steps)
                        : request.interleave == "on";
  plan.overlap = true;
  if (!embedded) return plan;
  if (plan.interleave) {
    plan.search_threads = request.search_threads > 0 ? request.search_threads
                          : small_steps              ? std::max(1, threads - 1)
                                                     : 1;
    plan.model_threads = std::max(1, threads - plan.search_threads);
    return plan;
  }
  plan.search_threads = request.search_threads > 0 ? request.search_threads
                        : request.mode == "knn" && step_rows <= kOverlapStepRows ? 1
                                                                                 : threads;
  // A search beside the model gets cores of its own: OpenMP teams that share cores preempt
  // each other at every barrier.
  plan.overlap = plan.search_threads < threads;
  if (plan.overlap)
    plan.model_threads = std::min(plan.model_threads, threads - plan.search_threads);
  return plan;
}

}  // namespace knnserve::knn
