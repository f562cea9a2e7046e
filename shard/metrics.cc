#include "shard/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace knnserve {
namespace {

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// `a="x",b="y"` (no braces), so that histograms can append `le`.
std::string RenderLabels(const MetricLabels& labels) {
  std::string out;
  for (const auto& [key, value] : labels) {
    absl::StrAppend(&out, out.empty() ? "" : ",", key, "=\"", EscapeLabelValue(value), "\"");
  }
  return out;
}

std::string Braced(const std::string& labels) {
  return labels.empty() ? "" : absl::StrCat("{", labels, "}");
}

std::string FormatBound(double bound) { return std::isinf(bound) ? "+Inf" : absl::StrCat(bound); }

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<int64_t>[bounds_.size() + 1]) {
  KNNSERVE_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()), "histogram bounds unsorted");
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(static_cast<int64_t>(std::llround(value * 1e9)), std::memory_order_relaxed);
}

std::vector<int64_t> Histogram::bucket_counts() const {
  std::vector<int64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = buckets_[i].load(std::memory_order_relaxed);
  }
  return counts;
}

double Histogram::sum() const { return sum_nanos_.load(std::memory_order_relaxed) * 1e-9; }

std::vector<double> Histogram::LatencyBounds() {
  return {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
          50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};
}

std::vector<double> Histogram::SizeBounds() {
  std::vector<double> bounds;
  for (double b = 1; b <= 4096; b *= 2) bounds.push_back(b);
  return bounds;
}

MetricsRegistry::Family& MetricsRegistry::GetFamily(const std::string& name,
                                                    const std::string& help, Type type) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  }
  KNNSERVE_CHECK(it->second.type == type, "metric registered twice with different types");
  return it->second;
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = GetFamily(name, help, Type::kCounter).counters[RenderLabels(labels)];
  if (slot == nullptr) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = GetFamily(name, help, Type::kGauge).gauges[RenderLabels(labels)];
  if (slot == nullptr) slot = std::make_unique<Gauge>();
  return slot.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         const MetricLabels& labels, std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  auto& slot = GetFamily(name, help, Type::kHistogram).histograms[RenderLabels(labels)];
  if (slot == nullptr) slot = std::make_unique<Histogram>(std::move(bounds));
  return slot.get();
}

std::string MetricsRegistry::RenderText() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    static constexpr const char* kTypeNames[] = {"counter", "gauge", "histogram"};
    absl::StrAppend(&out, "# HELP ", name, " ", family.help, "\n# TYPE ", name, " ",
                    kTypeNames[static_cast<int>(family.type)], "\n");
    for (const auto& [labels, counter] : family.counters) {
      absl::StrAppend(&out, name, Braced(labels), " ", counter->value(), "\n");
    }
    for (const auto& [labels, gauge] : family.gauges) {
      absl::StrAppend(&out, name, Braced(labels), " ", gauge->value(), "\n");
    }
    for (const auto& [labels, histogram] : family.histograms) {
      const std::vector<int64_t> counts = histogram->bucket_counts();
      const std::string sep = labels.empty() ? "" : ",";
      int64_t cumulative = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        cumulative += counts[i];
        const double bound = i < histogram->bounds().size() ? histogram->bounds()[i] : INFINITY;
        absl::StrAppend(&out, name, "_bucket{", labels, sep, "le=\"", FormatBound(bound), "\"} ",
                        cumulative, "\n");
      }
      absl::StrAppend(&out, name, "_sum", Braced(labels), " ", histogram->sum(), "\n", name,
                      "_count", Braced(labels), " ", histogram->count(), "\n");
    }
  }
  return out;
}

}  // namespace knnserve
