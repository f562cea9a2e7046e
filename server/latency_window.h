// Recent latencies of one shard, for the hedge delay ("after the observed p95").
#ifndef KNNSERVE_SERVER_LATENCY_WINDOW_H_
#define KNNSERVE_SERVER_LATENCY_WINDOW_H_

#include <cstddef>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace knnserve {

// The last `capacity` samples. Thread-safe.
class LatencyWindow {
 public:
  explicit LatencyWindow(size_t capacity = 512);

  void Add(absl::Duration latency);
  // The q-quantile (0..1) of the window; nullopt with fewer than `min_samples` samples.
  std::optional<absl::Duration> Quantile(double q, size_t min_samples) const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::vector<absl::Duration> samples_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace knnserve

#endif  // KNNSERVE_SERVER_LATENCY_WINDOW_H_
