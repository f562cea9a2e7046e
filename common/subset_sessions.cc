#include "common/subset_sessions.h"

#include <utility>

#include "absl/random/random.h"

namespace knnserve {

std::string NewSubsetSession() {
  thread_local absl::BitGen bits;  // seeded from the OS's entropy
  std::string token(16, '\0');
  for (char& c : token) c = static_cast<char>(absl::Uniform<uint8_t>(bits));
  return token;
}

int64_t SubsetSessions::Charge(const SubsetGroups& groups) {
  int64_t charge = kSessionOverhead;
  for (const std::vector<int64_t>& group : groups) {
    charge += kGroupOverhead + static_cast<int64_t>(group.size());
  }
  return charge;
}

std::string SubsetSessions::Put(absl::string_view token,
                                std::shared_ptr<const SubsetGroups> groups) {
  const int64_t charge = Charge(*groups);
  std::string forward_token = NewSubsetSession();
  absl::MutexLock lock(&mu_);
  if (auto it = by_token_.find(token); it != by_token_.end()) {
    // The same groups again (a client that sends them with every request) keep their token:
    // a new one would make every replica keep another copy, evicting other sessions.
    if (*it->second->kept.groups == *groups) forward_token = it->second->kept.forward_token;
    charged_ -= it->second->charge;
    lru_.erase(it->second);
    by_token_.erase(it);
  }
  if (charge > max_sentences_) return forward_token;
  while (charged_ + charge > max_sentences_) {
    charged_ -= lru_.back().charge;
    by_token_.erase(lru_.back().token);
    lru_.pop_back();
  }
  lru_.push_front({std::string(token), {std::move(groups), forward_token}, charge});
  by_token_.emplace(lru_.front().token, lru_.begin());
  charged_ += charge;
  return forward_token;
}

SubsetSessions::Kept SubsetSessions::Get(absl::string_view token) {
  absl::MutexLock lock(&mu_);
  auto it = by_token_.find(token);
  if (it == by_token_.end()) return {};
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->kept;
}

int64_t SubsetSessions::charged() const {
  absl::MutexLock lock(&mu_);
  return charged_;
}

}  // namespace knnserve
