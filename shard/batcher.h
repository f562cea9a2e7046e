// Dynamic batching: concurrent full searches with the same parameters are coalesced into one
// engine call, because faiss's throughput grows with the batch size. While another batch is
// running, the first request of the next batch waits at most `max_wait` for company (less when
// the batch fills up); a request on an idle shard runs at once, and work queued while the
// workers were busy is batched without waiting. Subset searches run alone (their rows already
// share one pass over the codes per group). The workers are ranked: a request that finds the
// shard idle always runs on the first one, and the others join only while the ones before them
// are busy. A small request on an idle shard runs on the
// submitting thread (see BatcherOptions::inline_budget).
#ifndef KNNSERVE_SHARD_BATCHER_H_
#define KNNSERVE_SHARD_BATCHER_H_

#include <algorithm>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/search_engine.h"
#include "shard/metrics.h"
#include "shard/search_backend.h"

namespace knnserve {

struct BatcherOptions {
  absl::Duration max_wait = absl::Milliseconds(1);
  int max_batch_rows = 1024;
  int num_threads = 2;  // engine calls that may run at once
  // Waiting for company pays only while the running engine calls (engine_threads OpenMP
  // threads each) occupy all `cores`; otherwise a request starts at once on a free worker.
  int engine_threads = 1;
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // A request that finds nothing queued, a core free and no other request running inline, and
  // whose expected engine time (its rows times the recent engine time per row) is at most this,
  // runs on the submitting thread: handing a decoding step to a worker and back costs two
  // thread switches, a large share of a small step. Kept short because the submitting thread
  // is a gRPC callback thread. Zero: never.
  absl::Duration inline_budget = absl::Milliseconds(2);
  // Bytes that waiting requests may hold (QueuedBytes: their fp32 queries, the subset ids they
  // declare, the answers they will get); a request beyond them is answered UNAVAILABLE
  // "overloaded" at once (the router tries another replica), so that callers sending faster
  // than the shard searches cannot grow its memory without bound. A request that finds the
  // queue empty is always queued.
  int64_t max_queued_bytes = int64_t{1} << 30;
};

using EngineDone = std::function<void(absl::StatusOr<EngineResult>)>;

// What a waiting request holds or will hold: its queries decoded to fp32, the sentence ids of
// the groups it declares (groups kept under a session are charged there), and its answer (rows
// x k distances, ids and values). Charging the queries alone let a one-row request carrying a
// million sentence ids, or asking for 1,024 neighbours, count as 2 KiB.
int64_t QueuedBytes(const SearchQuery& query);

// Thread-safe. The destructor answers everything still queued, then joins the workers.
class Batcher {
 public:
  // `engine` and `metrics` must outlive the batcher.
  Batcher(const SearchEngine* engine, BatcherOptions options, MetricsRegistry* metrics);
  ~Batcher();

  // `done` runs on a worker thread, or on the calling thread before Submit returns (see
  // BatcherOptions::inline_budget). Calls that are cancelled or past their deadline when their
  // turn comes are answered CANCELLED / DEADLINE_EXCEEDED without searching.
  void Submit(SearchCall call, EngineDone done);

 private:
  struct Pending {
    SearchCall call;
    EngineDone done;
    absl::Time enqueued;
    int64_t bytes;  // QueuedBytes(call.query)
  };

  // Worker `rank` (0 = first) takes queued work only while at least `rank` engine calls run.
  void Work(int rank);
  // The head of the queue and every queued request it can be coalesced with, up to
  // max_batch_rows rows; removed from the queue.
  std::vector<Pending> TakeBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t CompatibleRows() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWorkFor(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BatchReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RunsInline(const SearchQuery& query) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: the caller took a busy slot (++busy_). Run gives it back as soon as the engine
  // call returns (or at once when nothing is left to search), before anyone is answered: a
  // client that sends its next request on the answer finds this worker idle.
  void Run(std::vector<Pending> batch);
  void RunCoalesced(std::vector<Pending> batch);
  // The engine call on `query`, timed; gives back the caller's busy slot.
  absl::StatusOr<EngineResult> Search(const SearchQuery& query);
  void ReleaseBusySlot();

  const SearchEngine* const engine_;
  const BatcherOptions options_;
  Histogram* const batch_requests_;
  Histogram* const batch_rows_;
  Histogram* const engine_seconds_;
  Counter* const dropped_cancelled_;
  Counter* const dropped_deadline_;
  Counter* const dropped_overloaded_;

  absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool collecting_ ABSL_GUARDED_BY(mu_) = false;  // one worker at a time forms a batch
  absl::Time collect_deadline_ ABSL_GUARDED_BY(mu_);
  int busy_ ABSL_GUARDED_BY(mu_) = 0;  // engine calls running, inline ones included
  bool inline_running_ ABSL_GUARDED_BY(mu_) = false;
  // Moving average of the engine's seconds per query row; negative until a call finished.
  double seconds_per_row_ ABSL_GUARDED_BY(mu_) = -1.0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace knnserve

#endif  // KNNSERVE_SHARD_BATCHER_H_
