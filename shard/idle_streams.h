// Ends streams whose client has sent nothing for a while: an open stream holds its subset
// groups (--max-stream-groups-mib) and a place among the server's streams for as long as it
// lasts, so a client that keeps idle streams open would get other clients refused.
#ifndef KNNSERVE_SHARD_IDLE_STREAMS_H_
#define KNNSERVE_SHARD_IDLE_STREAMS_H_

#include <chrono>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"
#include "shard/metrics.h"

namespace knnserve {

// Streams registered with Add are ended (EndIfIdleSince) once they have waited longer than
// `timeout` for their client's next message; a sweeper thread looks every min(timeout / 2,
// 1 s), so a stream ends between `timeout` and about 1.5 x `timeout` (at most 1 s more) after
// its client's last message. A zero timeout ends none and starts no thread. REQUIRES: timeout
// zero or at least kMinTimeout. Thread-safe.
class IdleStreams {
 public:
  // What a stream offers the sweeper. Ref/Unref keep it alive while the sweeper ends it
  // outside the registry's lock (its OnDone may run meanwhile).
  class Stream {
   public:
    virtual ~Stream() = default;
    // Ends the stream with `status` if it has been waiting for its client's next message since
    // before `cutoff` (steady clock: a wall clock stepped forward would end every stream at
    // once); true if it did.
    virtual bool EndIfIdleSince(std::chrono::steady_clock::time_point cutoff,
                                const grpc::Status& status) = 0;
    virtual void Ref() = 0;
    virtual void Unref() = 0;
  };

  // Shorter timeouts would end streams between their setup and first step, and sweep in a loop.
  static constexpr absl::Duration kMinTimeout = absl::Seconds(1);

  // `ended` (borrowed) counts the streams ended for idleness.
  IdleStreams(absl::Duration timeout, Counter* ended);
  ~IdleStreams();  // REQUIRES: every added stream removed
  IdleStreams(const IdleStreams&) = delete;
  IdleStreams& operator=(const IdleStreams&) = delete;

  void Add(Stream* stream);
  void Remove(Stream* stream);

 private:
  void Sweep();

  const absl::Duration timeout_;
  const grpc::Status status_;  // what an idle stream's client gets
  Counter* const ended_;
  absl::Mutex mu_;
  absl::flat_hash_set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;  // last: started after the fields it reads
};

}  // namespace knnserve

#endif  // KNNSERVE_SHARD_IDLE_STREAMS_H_
