#include "shard/batcher.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/request.h"

namespace knnserve {
namespace {

bool Coalescable(const SearchQuery& a, const SearchQuery& b) {
  return !a.is_subset() && !b.is_subset() && a.params.k == b.params.k &&
         a.params.nprobe == b.params.nprobe && a.params.ef_search == b.params.ef_search;
}

// Rows [begin, begin + rows) of `all`.
Neighbors SliceRows(const Neighbors& all, int64_t begin, int64_t rows) {
  Neighbors part;
  part.rows = rows;
  part.k = all.k;
  const int64_t from = begin * all.k;
  const int64_t to = (begin + rows) * all.k;
  part.distances.assign(all.distances.begin() + from, all.distances.begin() + to);
  part.ids.assign(all.ids.begin() + from, all.ids.begin() + to);
  if (all.has_values()) part.values.assign(all.values.begin() + from, all.values.begin() + to);
  return part;
}

Counter* DroppedCounter(MetricsRegistry* metrics, const char* reason) {
  return metrics->GetCounter("knnserve_dropped_total",
                             "Queued requests dropped before searching, by reason",
                             {{"reason", reason}});
}

}  // namespace

Batcher::Batcher(const SearchEngine* engine, BatcherOptions options, MetricsRegistry* metrics)
    : engine_(engine),
      options_(options),
      batch_requests_(metrics->GetHistogram("knnserve_batch_requests",
                                            "Requests coalesced into one engine call", {},
                                            Histogram::SizeBounds())),
      batch_rows_(metrics->GetHistogram("knnserve_batch_rows", "Query rows per engine call", {},
                                        Histogram::SizeBounds())),
      engine_seconds_(metrics->GetHistogram("knnserve_engine_seconds",
                                            "Time spent in one engine call", {},
                                            Histogram::LatencyBounds())),
      dropped_cancelled_(DroppedCounter(metrics, "cancelled")),
      dropped_deadline_(DroppedCounter(metrics, "deadline")),
      dropped_overloaded_(DroppedCounter(metrics, "overloaded")) {
  for (int i = 0; i < std::max(1, options_.num_threads); ++i) {
    workers_.emplace_back([this, i] {
      // Named so that top -H and perf --sort comm tell engine time from gRPC's threads.
      pthread_setname_np(pthread_self(), "knn-batch");
      Work(i);
    });
  }
}

Batcher::~Batcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

int64_t QueuedBytes(const SearchQuery& query) {
  const int64_t ids = query.declares_groups ? TotalSentenceIds(*query.subset_groups) : 0;
  return query.queries.size() * static_cast<int64_t>(sizeof(float)) +
         ids * static_cast<int64_t>(sizeof(int64_t)) + AnswerBytes(query);
}

void Batcher::Submit(SearchCall call, EngineDone done) {
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (stop_) {  // no worker would take it
      lock.Release();
      done(absl::UnavailableError("the shard is stopping"));
      return;
    }
    if (!RunsInline(call.query)) {
      const int64_t bytes = QueuedBytes(call.query);
      if (!queue_.empty() && queued_bytes_ + bytes > options_.max_queued_bytes) {
        const absl::Status overloaded = absl::UnavailableError(absl::StrCat(
            kShardOverloaded, ": ", queued_bytes_ >> 20, " MiB of requests already wait (at most ",
            options_.max_queued_bytes >> 20, " MiB)"));
        lock.Release();
        dropped_overloaded_->Increment();
        done(overloaded);
        return;
      }
      queued_bytes_ += bytes;
      queue_.push_back({std::move(call), std::move(done), absl::Now(), bytes});
      return;
    }
    ++busy_;
    inline_running_ = true;
  }
  std::vector<Pending> alone;
  alone.push_back({std::move(call), std::move(done), absl::Now(), 0});
  Run(std::move(alone));
  absl::MutexLock lock(&mu_);
  inline_running_ = false;
}

bool Batcher::RunsInline(const SearchQuery& query) const {
  // One inline call at a time, so that the other gRPC threads keep receiving; and only on an
  // idle shard, so that queued work keeps its order and dynamic batching is untouched.
  if (stop_ || inline_running_ || !queue_.empty() || seconds_per_row_ < 0 ||
      busy_ * options_.engine_threads >= options_.cores) {
    return false;
  }
  return query.queries.rows() * seconds_per_row_ <= absl::ToDoubleSeconds(options_.inline_budget);
}

absl::StatusOr<EngineResult> Batcher::Search(const SearchQuery& query) {
  const absl::Time start = absl::Now();
  absl::StatusOr<EngineResult> result = engine_->Search(query);
  const absl::Duration took = absl::Now() - start;
  engine_seconds_->ObserveDuration(took);
  const double per_row = absl::ToDoubleSeconds(took) / std::max<int64_t>(1, query.queries.rows());
  absl::MutexLock lock(&mu_);
  seconds_per_row_ = seconds_per_row_ < 0 ? per_row : 0.75 * seconds_per_row_ + 0.25 * per_row;
  --busy_;
  return result;
}

void Batcher::ReleaseBusySlot() {
  absl::MutexLock lock(&mu_);
  --busy_;
}

int64_t Batcher::CompatibleRows() const {
  const SearchQuery& head = queue_.front().call.query;
  int64_t rows = 0;
  for (const Pending& pending : queue_) {
    if (&pending == &queue_.front() || Coalescable(head, pending.call.query)) {
      rows += pending.call.query.queries.rows();
    }
  }
  return rows;
}

// Never while another worker collects, stopping included: two collectors would both take from
// a queue that only one of them may empty.
bool Batcher::HasWork() const { return !collecting_ && (stop_ || !queue_.empty()); }

// Idle workers all waiting for any work took turns (the mutex wakes its waiters in order), so
// that consecutive requests of one client ran on alternating threads, each finding the caches
// of its core and of its thread-local scratch cold: router + 1 shard, IVF1024,PQ64 1M x 512,
// batch 64, one client, p50 overhead over in-process 4.4 / 5.7 ms on ~60 ms requests; with
// lone requests kept on the first worker 1.34 / 1.21 ms (sixteenth session, docs/service.md).
bool Batcher::HasWorkFor(int rank) const { return HasWork() && (stop_ || busy_ >= rank); }

bool Batcher::BatchReady() const {
  // Waiting for company only pays under load: a request on an idle shard, or while the calls
  // already running leave cores free, runs at once (two one-thread calls side by side finish
  // sooner than one call of both).
  if (stop_ || busy_ * options_.engine_threads < options_.cores ||
      absl::Now() >= collect_deadline_ || queue_.front().call.query.is_subset())
    return true;
  return CompatibleRows() >= options_.max_batch_rows;
}

std::vector<Batcher::Pending> Batcher::TakeBatch() {
  std::vector<Pending> batch;
  batch.push_back(std::move(queue_.front()));
  queue_.pop_front();
  int64_t rows = batch.front().call.query.queries.rows();
  std::deque<Pending> rest;
  for (Pending& pending : queue_) {
    const int64_t pending_rows = pending.call.query.queries.rows();
    if (Coalescable(batch.front().call.query, pending.call.query) &&
        rows + pending_rows <= options_.max_batch_rows) {
      rows += pending_rows;
      batch.push_back(std::move(pending));
    } else {
      rest.push_back(std::move(pending));
    }
  }
  queue_.swap(rest);
  for (const Pending& pending : batch) queued_bytes_ -= pending.bytes;
  return batch;
}

void Batcher::Work(int rank) {
  struct Turn {
    const Batcher* batcher;
    int rank;
  } turn{this, rank};
  // Evaluated by the mutex with mu_ held.
  const absl::Condition my_turn(
      +[](Turn* t) ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->batcher->HasWorkFor(t->rank); },
      &turn);
  while (true) {
    std::vector<Pending> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(my_turn);
      if (queue_.empty()) return;  // stopping, and everything queued has been answered
      collecting_ = true;
      collect_deadline_ = queue_.front().enqueued + options_.max_wait;
      // Wakes when Submit adds rows (conditions are re-evaluated when the mutex is released)
      // or at the deadline.
      mu_.AwaitWithDeadline(absl::Condition(this, &Batcher::BatchReady), collect_deadline_);
      batch = TakeBatch();
      collecting_ = false;
      ++busy_;
    }
    Run(std::move(batch));
  }
}

void Batcher::Run(std::vector<Pending> batch) {
  const absl::Time now = absl::Now();
  std::vector<Pending> live;
  for (Pending& pending : batch) {
    if (pending.call.cancel->cancelled()) {
      dropped_cancelled_->Increment();
      pending.done(absl::CancelledError("the caller cancelled the request"));
    } else if (now >= pending.call.deadline) {
      dropped_deadline_->Increment();
      pending.done(absl::DeadlineExceededError("the deadline passed while the request queued"));
    } else {
      live.push_back(std::move(pending));
    }
  }
  if (live.empty()) {
    ReleaseBusySlot();
    return;
  }
  int64_t rows = 0;
  for (const Pending& pending : live) rows += pending.call.query.queries.rows();
  batch_requests_->Observe(live.size());
  batch_rows_->Observe(rows);
  if (live.size() == 1) {
    live.front().done(Search(live.front().call.query));
    return;
  }
  RunCoalesced(std::move(live));
}

void Batcher::RunCoalesced(std::vector<Pending> batch) {
  const int64_t dim = batch.front().call.query.queries.cols();
  int64_t rows = 0;
  for (const Pending& pending : batch) rows += pending.call.query.queries.rows();
  SearchQuery merged;
  merged.params = batch.front().call.query.params;
  merged.queries = Matrix<float>(rows, dim);
  int64_t row = 0;
  for (const Pending& pending : batch) {
    const Matrix<float>& queries = pending.call.query.queries;
    std::memcpy(merged.queries.row(row), queries.data(), queries.size() * sizeof(float));
    row += queries.rows();
  }
  absl::StatusOr<EngineResult> result = Search(merged);
  row = 0;
  for (Pending& pending : batch) {
    const int64_t part_rows = pending.call.query.queries.rows();
    if (result.ok()) {
      pending.done(
          EngineResult{SliceRows(result->neighbors, row, part_rows), result->vectors_searched});
    } else {
      pending.done(result.status());
    }
    row += part_rows;
  }
}

}  // namespace knnserve
