#include "shard/idle_streams.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/check.h"

namespace knnserve {

IdleStreams::IdleStreams(absl::Duration timeout, Counter* ended)
    : timeout_(timeout),
      // UNAVAILABLE: a transient end, which clients (RemoteRetriever among them) answer by
      // opening another stream with the same setup.
      status_(grpc::StatusCode::UNAVAILABLE,
              absl::StrCat("stream ended: no message for ", absl::FormatDuration(timeout),
                           " (--stream-idle-seconds); open another")),
      ended_(ended) {
  KNNSERVE_CHECK(timeout_ == absl::ZeroDuration() || timeout_ >= kMinTimeout,
                 "stream idle timeout below kMinTimeout");
  if (timeout_ > absl::ZeroDuration()) sweeper_ = std::thread([this] { Sweep(); });
}

IdleStreams::~IdleStreams() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (sweeper_.joinable()) sweeper_.join();
}

void IdleStreams::Add(Stream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.insert(stream);
}

void IdleStreams::Remove(Stream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
}

void IdleStreams::Sweep() {
  const absl::Duration period = std::min(timeout_ / 2, absl::Seconds(1));
  const auto timeout = absl::ToChronoNanoseconds(timeout_);
  mu_.Lock();
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) {
    const auto cutoff = std::chrono::steady_clock::now() - timeout;
    // Ended outside the lock: ending a stream may run its OnDone, which removes it.
    std::vector<Stream*> streams(streams_.begin(), streams_.end());
    for (Stream* stream : streams) stream->Ref();
    mu_.Unlock();
    for (Stream* stream : streams) {
      if (stream->EndIfIdleSince(cutoff, status_)) ended_->Increment();
      stream->Unref();
    }
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace knnserve
