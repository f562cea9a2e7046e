#include "shard/search_backend.h"

#include <utility>

namespace knnserve {

void CancelToken::Cancel() {
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    callbacks.swap(callbacks_);
  }
  for (auto& callback : callbacks) callback();
}

bool CancelToken::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void CancelToken::OnCancel(std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

}  // namespace knnserve
