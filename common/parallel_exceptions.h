// Exceptions out of OpenMP parallel regions. An exception that leaves the structured block of
// a region on any of its threads ends the process (std::terminate), so the allocations inside
// the search kernels' regions (per-thread scratch, heaps) would take a whole shard down with
// them when memory runs out.
#ifndef KNNSERVE_COMMON_PARALLEL_EXCEPTIONS_H_
#define KNNSERVE_COMMON_PARALLEL_EXCEPTIONS_H_

#include <exception>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace knnserve {

// Catches what the threads of one parallel region throw, for the thread that started the
// region to handle after it:
//
//   ParallelExceptions exceptions;
//   #pragma omp parallel for
//   for (...) exceptions.Run([&] { ... });
//   RETURN_IF_ERROR(exceptions.ToStatus("IVF ADC search"));
//
// The first exception caught is kept and the others dropped; the work of the other iterations
// still runs. Thread-safe: Run may be called from every thread of the region at once.
class ParallelExceptions {
 public:
  template <typename Body>
  void Run(Body&& body) noexcept {
    try {
      body();
    } catch (...) {
      Keep(std::current_exception());
    }
  }

  // After the region: OK when nothing was thrown; RESOURCE_EXHAUSTED "<what>: out of memory"
  // for std::bad_alloc; INTERNAL "<what>: <e.what()>" for any other exception.
  absl::Status ToStatus(absl::string_view what) const;
  // After the region: throws the first exception caught, if any (for code inside an adapter
  // that converts exceptions itself).
  void RethrowFirst() const;

 private:
  void Keep(std::exception_ptr exception) noexcept;

  mutable absl::Mutex mu_;
  std::exception_ptr first_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_PARALLEL_EXCEPTIONS_H_
