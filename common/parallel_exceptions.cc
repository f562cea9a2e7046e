#include "common/parallel_exceptions.h"

#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace knnserve {

void ParallelExceptions::Keep(std::exception_ptr exception) noexcept {
  absl::MutexLock lock(&mu_);
  if (first_ == nullptr) first_ = std::move(exception);
}

absl::Status ParallelExceptions::ToStatus(absl::string_view what) const {
  absl::MutexLock lock(&mu_);
  if (first_ == nullptr) return absl::OkStatus();
  try {
    std::rethrow_exception(first_);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": an exception of unknown type"));
  }
}

void ParallelExceptions::RethrowFirst() const {
  std::exception_ptr first;
  {
    absl::MutexLock lock(&mu_);
    first = first_;
  }
  if (first != nullptr) std::rethrow_exception(first);
}

}  // namespace knnserve
