#include "common/subset_sessions.h"

#include <utility>

namespace knnserve {

void SubsetSessions::Put(absl::string_view token, std::shared_ptr<const SubsetGroups> groups) {
  int64_t sentences = 0;
  for (const std::vector<int64_t>& group : *groups) sentences += group.size();
  absl::MutexLock lock(&mu_);
  if (auto it = by_token_.find(token); it != by_token_.end()) {
    sentences_ -= it->second->sentences;
    lru_.erase(it->second);
    by_token_.erase(it);
  }
  if (sentences > max_sentences_) return;
  while (sentences_ + sentences > max_sentences_) {
    sentences_ -= lru_.back().sentences;
    by_token_.erase(lru_.back().token);
    lru_.pop_back();
  }
  lru_.push_front({std::string(token), std::move(groups), sentences});
  by_token_.emplace(lru_.front().token, lru_.begin());
  sentences_ += sentences;
}

std::shared_ptr<const SubsetGroups> SubsetSessions::Get(absl::string_view token) {
  absl::MutexLock lock(&mu_);
  auto it = by_token_.find(token);
  if (it == by_token_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->groups;
}

int64_t SubsetSessions::sentences() const {
  absl::MutexLock lock(&mu_);
  return sentences_;
}

}  // namespace knnserve
