#include "server/latency_window.h"

#include <algorithm>
#include <cmath>

namespace knnserve {

LatencyWindow::LatencyWindow(size_t capacity) : capacity_(capacity) { samples_.reserve(capacity_); }

void LatencyWindow::Add(absl::Duration latency) {
  absl::MutexLock lock(&mu_);
  if (samples_.size() < capacity_) {
    samples_.push_back(latency);
  } else {
    samples_[next_] = latency;
  }
  next_ = (next_ + 1) % capacity_;
}

std::optional<absl::Duration> LatencyWindow::Quantile(double q, size_t min_samples) const {
  std::vector<absl::Duration> sorted;
  {
    absl::MutexLock lock(&mu_);
    if (samples_.empty() || samples_.size() < min_samples) return std::nullopt;
    sorted = samples_;
  }
  const size_t index = std::min(
      sorted.size() - 1, static_cast<size_t>(std::max(1.0, std::ceil(q * sorted.size()))) - 1);
  std::nth_element(sorted.begin(), sorted.begin() + index, sorted.end());
  return sorted[index];
}

}  // namespace knnserve
