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

// A new random token for a subset session (16 bytes: no two sessions of any router collide).
std::string NewSubsetSession();

// A least-recently-used map from session token to validated groups, bounded by the memory they
// take, counted in sentence ids (8 bytes each): a session's ids plus its bookkeeping.
// Thread-safe.
//
// Each Put also mints a new token for the groups it keeps (`Kept::forward_token`), under which a
// router names them to its shards. A client may replace a token's groups, and the replicas of
// a shard see only the requests routed to them: forwarded under the client's token, a replica
// that missed the replacement would search the old groups. Under a token minted per Put, it
// does not know the token and the router sends the groups again.
class SubsetSessions {
 public:
  // About 64 MiB of ids: 256 decoding batches of 64 sentences x 512 subset sentences.
  static constexpr int64_t kDefaultMaxSentences = int64_t{1} << 23;
  // What a session and each of its groups take besides their ids, in ids: the tokens (three
  // strings), the list node, the map slot and the groups' control block; a group's vector. Without
  // them a flood of one-id sessions held ~40x the bound.
  static constexpr int64_t kSessionOverhead = 40;
  static constexpr int64_t kGroupOverhead = 4;

  explicit SubsetSessions(int64_t max_sentences = kDefaultMaxSentences)
      : max_sentences_(max_sentences) {}

  struct Kept {
    std::shared_ptr<const SubsetGroups> groups;  // null: nothing kept under the token
    std::string forward_token;                   // minted by the Put that kept `groups`
  };

  // Keeps `groups` under `token` (replacing what it held), evicting the least recently used
  // sessions until they fit, and returns the forwarding token it minted for them (the one it
  // had, when the token held equal groups). Groups larger
  // than the whole bound are not kept (a token is still minted).
  std::string Put(absl::string_view token, std::shared_ptr<const SubsetGroups> groups);
  // What is kept under `token` (now the most recently used).
  Kept Get(absl::string_view token);

  // What the kept sessions take, in ids (at most max_sentences).
  int64_t charged() const;

  // What `groups` take when kept, in ids.
  static int64_t Charge(const SubsetGroups& groups);

 private:
  struct Entry {
    std::string token;
    Kept kept;
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
