#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace knnserve {
namespace {

constexpr absl::Duration kRedrawInterval = absl::Milliseconds(100);
constexpr absl::Duration kUnknownTotalInterval = absl::Seconds(30);
constexpr int kBarWidth = 24;

bool IsTerminal(std::FILE* out) { return out != nullptr && isatty(fileno(out)) == 1; }

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, Options options)
    : label_(std::move(label)),
      total_(total),
      options_(std::move(options)),
      interactive_(options_.interactive < 0 ? IsTerminal(options_.out)
                                            : options_.interactive == 1),
      start_(options_.now()),
      last_print_(start_) {}

ProgressBar::~ProgressBar() { Finish(); }

int64_t ProgressBar::done() const {
  absl::ReaderMutexLock lock(&mu_);
  return done_;
}

std::string ProgressBar::HumanCount(double value) {
  static constexpr const char* kSuffixes[] = {"", "k", "M", "G", "T"};
  int i = 0;
  while (std::fabs(value) >= 1000 && i < 4) {
    value /= 1000;
    ++i;
  }
  if (i == 0) return absl::StrFormat("%.0f", value);
  return absl::StrFormat(value < 10 ? "%.2f%s" : value < 100 ? "%.1f%s" : "%.0f%s", value,
                         kSuffixes[i]);
}

std::string ProgressBar::HumanDuration(absl::Duration d) {
  const int64_t seconds = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (seconds >= 3600) {
    return absl::StrFormat("%d:%02d:%02d", seconds / 3600, seconds / 60 % 60, seconds % 60);
  }
  return absl::StrFormat("%d:%02d", seconds / 60, seconds % 60);
}

std::string ProgressBar::StatusLine(int64_t done, absl::Time now) const {
  const double seconds = absl::ToDoubleSeconds(now - start_);
  const double rate = seconds > 0 ? done / seconds : 0;
  std::string line = label_;
  if (total_ > 0) {
    const double fraction = std::min(1.0, static_cast<double>(done) / total_);
    if (interactive_) {
      const int filled = static_cast<int>(fraction * kBarWidth);
      absl::StrAppend(&line, " [", std::string(filled, '#'),
                      std::string(kBarWidth - filled, '.'), "]");
    }
    absl::StrAppend(&line, absl::StrFormat(" %3.0f%% ", 100 * fraction), HumanCount(done), "/",
                    HumanCount(total_));
  } else {
    absl::StrAppend(&line, " ", HumanCount(done));
  }
  absl::StrAppend(&line, " ", options_.unit, " ", HumanCount(rate), " ", options_.unit, "/s");
  if (total_ > 0 && rate > 0 && done < total_) {
    absl::StrAppend(&line, " ETA ", HumanDuration(absl::Seconds((total_ - done) / rate)));
  }
  return line;
}

void ProgressBar::Print(const std::string& line, bool in_place) {
  if (options_.out == nullptr) return;
  if (in_place) {
    std::fprintf(options_.out, "\r%s\033[K", line.c_str());
  } else {
    std::fprintf(options_.out, "%s\n", line.c_str());
  }
  std::fflush(options_.out);
}

void ProgressBar::Add(int64_t n) {
  const absl::Time now = options_.now();
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  done_ += n;
  if (interactive_) {
    if (now - last_print_ < kRedrawInterval) return;
    last_print_ = now;
    Print(StatusLine(done_, now), /*in_place=*/true);
    return;
  }
  if (total_ > 0) {
    const int step = std::max(1, options_.percent_step);
    const int percent = static_cast<int>(100 * std::min(done_, total_) / total_);
    const int reached = percent / step * step;
    if (reached > last_step_printed_ && percent < 100) {
      last_step_printed_ = reached;
      Print(StatusLine(done_, now), /*in_place=*/false);
    }
  } else if (now - last_print_ >= kUnknownTotalInterval) {
    last_print_ = now;
    Print(StatusLine(done_, now), /*in_place=*/false);
  }
}

void ProgressBar::Finish() {
  const absl::Time now = options_.now();
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  finished_ = true;
  const double seconds = absl::ToDoubleSeconds(now - start_);
  std::string line =
      absl::StrCat(label_, ": ", HumanCount(done_), " ", options_.unit, " in ",
                   absl::StrFormat("%.1f", seconds), " s (",
                   HumanCount(seconds > 0 ? done_ / seconds : 0), " ", options_.unit, "/s)");
  if (interactive_) {
    Print(StatusLine(done_, now), /*in_place=*/true);
    std::fputc('\n', options_.out);
  }
  Print(line, /*in_place=*/false);
}

}  // namespace knnserve
