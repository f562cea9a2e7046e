// OpenMP's thread count for the parallel regions the calling thread starts, set for one scope.
#ifndef KNNSERVE_COMMON_OMP_THREADS_H_
#define KNNSERVE_COMMON_OMP_THREADS_H_

#include <omp.h>

namespace knnserve {

// Sets the calling thread's OpenMP thread count (omp_set_num_threads) and restores the previous
// one when destroyed. The count is per thread and LibTorch's and OpenBLAS's parallel regions
// read it too: a search run on the decoding thread must leave the model with the threads the
// caller gave it (LibTorch may also have set it to 1 before a search, hence the set).
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int threads) : previous_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;
  ~ScopedOmpThreads() { omp_set_num_threads(previous_); }

 private:
  const int previous_;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_OMP_THREADS_H_
