// Timing helpers shared by the benchmark CLIs.
#ifndef KNNSERVE_BENCH_BENCH_TIMING_H_
#define KNNSERVE_BENCH_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>
#include <functional>

namespace knnserve {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best-of-`reps` seconds of `fn` (after one warm-up call).
inline double TimeBest(int reps, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return best;
}

}  // namespace knnserve

#endif  // KNNSERVE_BENCH_BENCH_TIMING_H_
