#include "shard/search_backend.h"

#include <utility>

namespace knnserve {

void CancelToken::Cancel() {
  std::map<int64_t, std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    callbacks.swap(callbacks_);
  }
  for (auto& [id, callback] : callbacks) callback();
}

bool CancelToken::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

int64_t CancelToken::OnCancel(std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      callbacks_.emplace(next_id_, std::move(callback));
      return next_id_++;
    }
  }
  callback();
  return -1;
}

void CancelToken::Forget(int64_t id) {
  absl::MutexLock lock(&mu_);
  callbacks_.erase(id);
}

}  // namespace knnserve
