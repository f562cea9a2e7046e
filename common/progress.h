// A small progress bar for long jobs (index build, key computation, training).
//
// On a terminal it redraws one line in place (at most 10 times a second) with the bar, count,
// rate and ETA. When stderr is not a terminal (CI, logs) it stays quiet and prints one line
// each time another `percent_step`% is done (or every 30 s when the total is unknown), and a
// summary line at the end.
//
// Thread-safe: Add() may be called from many threads.
#ifndef KNNSERVE_COMMON_PROGRESS_H_
#define KNNSERVE_COMMON_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace knnserve {

class ProgressBar {
 public:
  struct Options {
    std::FILE* out = stderr;
    // -1: decide from isatty(out); 0/1 force the non-interactive/interactive style.
    int interactive = -1;
    int percent_step = 10;
    std::string unit = "items";
    std::function<absl::Time()> now = absl::Now;  // injectable for tests
  };

  // total <= 0 means unknown (no percentage or ETA).
  ProgressBar(std::string label, int64_t total, Options options);
  ProgressBar(std::string label, int64_t total) : ProgressBar(std::move(label), total, {}) {}
  ~ProgressBar();  // calls Finish()

  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Add(int64_t n);
  // Prints the summary line once; later calls do nothing.
  void Finish();

  int64_t done() const;

  // "1.23k", "4.56M": a count or rate in three significant digits.
  static std::string HumanCount(double value);
  // "1:02:03" or "2:03".
  static std::string HumanDuration(absl::Duration d);

 private:
  std::string StatusLine(int64_t done, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Print(const std::string& line, bool in_place) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string label_;
  const int64_t total_;
  const Options options_;
  const bool interactive_;
  const absl::Time start_;

  mutable absl::Mutex mu_;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_print_ ABSL_GUARDED_BY(mu_);
  int last_step_printed_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_PROGRESS_H_
