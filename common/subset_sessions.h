// The subset groups that requests declared under a subset_session token, kept so that later
// requests of the same session can name the token instead of sending the groups again.
#ifndef KNNSERVE_COMMON_SUBSET_SESSIONS_H_
#define KNNSERVE_COMMON_SUBSET_SESSIONS_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/search_types.h"

namespace knnserve {

// A least-recently-used map from session token to validated groups, bounded by the memory they
// take, counted in sentence ids (8 bytes each): a session's ids plus its bookkeeping.
// Thread-safe.
class SubsetSessions {
 public:
  // About 64 MiB of ids: 256 decoding batches of 64 sentences x 512 subset sentences.
  static constexpr int64_t kDefaultMaxSentences = int64_t{1} << 23;
  // What a session and each of its groups take besides their ids, in ids: the token (twice),
  // the list node, the map slot and the groups' control block; a group's vector. Without them
  // a flood of one-id sessions held ~40x the bound.
  static constexpr int64_t kSessionOverhead = 32;
  static constexpr int64_t kGroupOverhead = 4;

  explicit SubsetSessions(int64_t max_sentences = kDefaultMaxSentences)
      : max_sentences_(max_sentences) {}

  // Keeps `groups` under `token` (replacing what it held), evicting the least recently used
  // sessions until they fit. Groups larger than the whole bound are not kept.
  void Put(absl::string_view token, std::shared_ptr<const SubsetGroups> groups);
  // The groups kept under `token` (now the most recently used), or null.
  std::shared_ptr<const SubsetGroups> Get(absl::string_view token);

  // What the kept sessions take, in ids (at most max_sentences).
  int64_t charged() const;

  // What `groups` take when kept, in ids.
  static int64_t Charge(const SubsetGroups& groups);

 private:
  struct Entry {
    std::string token;
    std::shared_ptr<const SubsetGroups> groups;
    int64_t charge;
  };

  const int64_t max_sentences_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> by_token_ ABSL_GUARDED_BY(mu_);
  int64_t charged_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_SUBSET_SESSIONS_H_
