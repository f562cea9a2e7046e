// Process metrics in the Prometheus text exposition format: counters, gauges and histograms,
// each identified by a name and a label set. Shards and routers record into one registry per
// process; MetricsHttpServer serves RenderText() on --metrics-listen.
#ifndef KNNSERVE_SHARD_METRICS_H_
#define KNNSERVE_SHARD_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace knnserve {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Thread-safe: lock-free increments.
class Counter {
 public:
  void Increment(int64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Thread-safe: lock-free updates.
class Gauge {
 public:
  void Add(int64_t n) { value_.fetch_add(n, std::memory_order_relaxed); }
  void Set(int64_t n) { value_.store(n, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Cumulative histogram over fixed upper bounds. Thread-safe: lock-free observations.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);
  void ObserveDuration(absl::Duration d) { Observe(absl::ToDoubleSeconds(d)); }

  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts; the last entry is the +Inf bucket.
  std::vector<int64_t> bucket_counts() const;
  int64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const;

  // Latency buckets in seconds: 50 us .. 10 s.
  static std::vector<double> LatencyBounds();
  // Batch-size buckets: 1, 2, 4, ... 4096.
  static std::vector<double> SizeBounds();

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<int64_t>[]> buckets_;
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> sum_nanos_{0};  // sum in units of 1e-9 (seconds or items)
};

// Owns every metric of a process. Get* returns the same object for the same name and labels;
// pointers stay valid for the registry's lifetime. Thread-safe.
class MetricsRegistry {
 public:
  Counter* GetCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          const MetricLabels& labels, std::vector<double> bounds);

  // Prometheus text format 0.0.4, families sorted by name.
  std::string RenderText() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::map<std::string, std::unique_ptr<Counter>> counters;  // keyed by rendered labels
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };
  Family& GetFamily(const std::string& name, const std::string& help, Type type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knnserve

#endif  // KNNSERVE_SHARD_METRICS_H_
