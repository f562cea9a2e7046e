// How a decoding run divides its threads between the model and the embedded search, and whether
// it keeps two batches in flight (decode::BeamSearchBatches). The rules and the measurements
// behind them are in thread_plan.cc.
#ifndef KNNSERVE_CLIENT_KNN_THREAD_PLAN_H_
#define KNNSERVE_CLIENT_KNN_THREAD_PLAN_H_

#include <cstdint>
#include <string>

namespace knnserve::knn {

// What the run asks for (translate's and tune's flags).
struct ThreadRequest {
  std::string mode = "base";        // base | knn | subset-knn
  bool remote = false;              // retrieval through a router
  std::string interleave = "auto";  // --interleave-batches: auto | on | off
  int search_threads = 0;           // --search-threads (0: the plan picks)
  int threads = 2;                  // --threads: all the run may use (>= 1)
  int64_t step_rows = 1;            // query rows of a full step: batch size x beam
};

struct ThreadPlan {
  int model_threads = 1;    // LibTorch's (and OpenBLAS's) OpenMP threads
  int search_threads = 1;   // the embedded search's (unused when remote)
  bool interleave = false;  // two batches in flight
  bool overlap = false;     // a step's search starts at BeginStep on the processor's worker
  // The embedded search's worker runs at idle CPU priority on cores the model's threads also
  // use (KnnOptions::background_search); otherwise, when it overlaps the model, the two get
  // separate cores.
  bool background_search = false;
};

// REQUIRES: request.threads >= 1, request.search_threads >= 0, interleave one of the three.
ThreadPlan PlanThreads(const ThreadRequest& request);

}  // namespace knnserve::knn

#endif  // KNNSERVE_CLIENT_KNN_THREAD_PLAN_H_
