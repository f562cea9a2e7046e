#include "client/knn/thread_plan.h"

#include <algorithm>

namespace knnserve::knn {
namespace {

// One batch at a time (--interleave-batches off, or one thread), up to this many query rows per
// step (batch x beam) the embedded full search runs beside the model. Measured on 2 cores, beam
// 5, before two batches could be in flight: overlapping the full search within a step paid at batch
// 1 and 16 (1.06-1.31x), where neither it nor the model's products keep both cores busy, and cost
// at batch 64 (the threads contend). Overlapping the subset search within a step cost at batch 16
// (0.87-0.89x) and was neutral at batch 1.
constexpr int64_t kOverlapStepRows = 80;

// Up to this many query rows per step (batch x beam), the model runs on one thread: its products
// are too small for a second OpenMP thread to repay the synchronization on these machines.
// Measured with base MT on 2 cores (200 office sentences, beam 5, two rounds), --threads 1
// against 2: 360 / 382 against 319 / 322 tokens/s at batch 1, 760 / 768 against 675 / 691 at
// batch 4, 889 / 903 against 882 / 871 at batch 8; at batch 16 level (966 / 959 against
// 1035 / 823), at batch 64 two threads are ~1.2x faster.
constexpr int64_t kOneModelThreadStepRows = 40;

// Beyond this many query rows per step (batch x beam) an embedded kNN-MT run with two batches
// in flight gives the model every thread, as base MT has, and runs a one-thread search in the
// background (ThreadPlan::background_search) instead of beside a model one thread short. Up to
// it, a one-thread model beside a one-thread search. Measured on 2 cores (200 office sentences,
// beam 5, seconds, three interleaved rounds, sixteenth session; base MT at two threads first),
// beside -> background: batch 16 (4.62 / 4.59 / 4.58) kNN-MT 5.25 / 5.24 / 5.42 -> 6.09 / 5.67 /
// 6.20, subset kNN-MT 5.24 / 5.23 / 5.09 -> 5.92 / 5.83 / 5.89; batch 32 (4.14 / 4.27 / 4.27)
// kNN-MT 4.97 / 4.88 / 4.83 -> 5.20 / 5.41 / 5.50, subset 4.92 / 4.97 / 4.99 -> 5.15 / 5.18 /
// 5.12; batch 64 (3.95 / 3.74 / 3.67) kNN-MT 4.92 / 5.01 / 4.85 -> 4.95 / 4.82 / 4.75, subset
// 4.87 / 4.95 / 4.84 -> 4.67 / 4.60 / 4.53. (The thirteenth session's machine, which brought in
// the background search beyond 40 rows, read batch 16 level and batch 64 1.05-1.4x faster in the
// background: kNN-MT 6.79 / 7.04 -> 6.56 / 6.26 and 7.37 / 8.88 -> 6.93 / 7.34, subset 8.31 /
// 7.35 -> 5.62 / 5.77 and 7.29 / 6.64 -> 6.58 / 6.01.) At batch 16 and 32 base MT gains little
// from a second thread (4.65 / 5.06 s on one, 4.41 / 5.04 on two at batch 16), so the model
// loses little on one, while a search in the background slows a two-thread model more than the
// search costs.
constexpr int64_t kBackgroundSearchStepRows = 160;

// Through a router whose servers share the decoder's cores, the model keeps one thread up to
// this many rows. Measured with the demo's router and 2 shards on the same 2 cores at idle
// priority (chrt -i; the scripts use nice 19, deploy/local/up.sh -n), kNN-MT, seconds, the
// model at one thread -> two: batch 16 7.57 / 8.19 -> 8.68 / 9.50 (base MT 5.05 / 6.17), batch
// 64 7.39 / 8.34 -> 6.44 / 7.59 (5.26 / 6.64); the servers at nice 19 and a two-thread model:
// 8.57 / 9.21 and 6.55 / 7.13; at normal priority and a one-thread model: 8.54 / 9.94 and
// 8.43 / 8.69.
constexpr int64_t kRemoteOneModelThreadStepRows = 80;

}  // namespace

// Interleaving pays where the retrieval does not take the model's cores. Through the demo's
// router and shards on 2 cores, with the decoder at --threads 1 (the servers take the other
// core; 300 office sentences, beam 5, two rounds), it took kNN-MT at batch 16 from 656 / 621 to
// 743 / 692 tokens/s and subset kNN-MT from 660 / 583 to 828 / 640 (at batch 64 level: 712 vs
// 709, 787 vs 783) against --threads 2 one batch at a time. Embedded, with two or more threads,
// it pays at every batch size since the model's products run on OpenBLAS's AVX-512 kernels
// (common/process_init.h): a one-thread model beside a one-thread search, 200 office sentences,
// two rounds, tokens/s one batch at a time -> interleaved (base MT at two threads): kNN-MT at
// batch 64 435 / 413 -> 623 / 566 (660 / 575), batch 32 389 / 482 -> 537 / 623 (691 / 685);
// subset kNN-MT at batch 64 521 / 389 -> 581 / 554 (650 / 719), batch 32 495 / 487 -> 621 / 619;
// the same translations. On the SSE3 kernels the model needed both cores at batch 64 and
// interleaving cost there (subset kNN-MT 921 / 925 -> 807 / 807, kNN-MT 877 / 900 -> 837 /
// 844), so until then it was on up to kOverlapStepRows only. Earlier, up to 80 rows: subset
// kNN-MT 463 / 474 -> 608 / 603 at batch 4, 791 / 799 -> 845 / 853 at batch 16; kNN-MT 858 /
// 885 -> 894 / 896 at batch 16, level at batch 1 (346 / 361 -> 352 / 358).
ThreadPlan PlanThreads(const ThreadRequest& request) {
  const int threads = request.threads;
  const int64_t step_rows = request.step_rows;
  ThreadPlan plan;
  const bool small_steps = step_rows <= kOneModelThreadStepRows;
  plan.model_threads = small_steps ? 1 : threads;
  if (request.mode == "base") return plan;
  const bool embedded = !request.remote;
  plan.interleave =
      request.interleave == "auto" ? !embedded || threads >= 2 : request.interleave == "on";
  plan.overlap = true;
  if (!embedded) {
    if (step_rows <= kRemoteOneModelThreadStepRows) plan.model_threads = 1;
    return plan;
  }
  if (plan.interleave) {
    if (request.search_threads == 0 && step_rows > kBackgroundSearchStepRows) {
      plan.search_threads = 1;
      plan.background_search = true;
      return plan;
    }
    plan.search_threads =
        request.search_threads > 0 ? request.search_threads : std::max(1, threads - 1);
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
