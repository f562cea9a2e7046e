#include "client/knn/thread_plan.h"

#include <algorithm>

namespace knnserve::knn {
namespace {

// Up to this many query rows per step (batch x beam), the embedded search runs beside the model,
// by default with two batches in flight (below). Measured on 2 cores, beam 5, interleaved, before
// two batches could be in flight: overlapping the full search within a step paid at batch 1 and
// 16 (1.06-1.31x), where neither it nor the model's products keep both cores busy, and cost at
// batch 64 (the threads contend). Overlapping the subset search within a step cost at batch 16
// (0.87-0.89x) and was neutral at batch 1.
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
// the model would use: it pays up to kOverlapStepRows, where the model keeps to one thread (or
// gains little from a second) and the search gets the others. Measured on 2 cores, 200 office
// sentences, two interleaved rounds, tokens/s one batch at a time -> interleaved: subset kNN-MT
// 463 / 474 -> 608 / 603 at batch 4, 791 / 799 -> 845 / 853 at batch 16; kNN-MT 858 / 885 ->
// 894 / 896 at batch 16, level at batch 1 (346 / 361 -> 352 / 358). At batch 64 it costs: a
// one-thread model beside the search loses more than the search takes (subset kNN-MT 921 / 925
// -> 807 / 807, kNN-MT 877 / 900 -> 837 / 844), and beside a two-thread model every search and
// the model's parallel regions preempt each other (subset kNN-MT: 2.64-2.69 s against
// 2.39-2.55 s).
ThreadPlan PlanThreads(const ThreadRequest& request) {
  const int threads = request.threads;
  const int64_t step_rows = request.step_rows;
  ThreadPlan plan;
  const bool small_steps = step_rows <= kOneModelThreadStepRows;
  plan.model_threads = small_steps ? 1 : threads;
  if (request.mode == "base") return plan;
  const bool embedded = !request.remote;
  plan.interleave = request.interleave == "auto"
                        ? !embedded || (threads >= 2 && step_rows <= kOverlapStepRows)
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
