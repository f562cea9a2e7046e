// Seeded random keys for the benchmark CLIs, generated on the fly: a 1M x 512 matrix would need
// 2 GB, which would also weigh on the memory the benchmarks measure.
#ifndef KNNSERVE_BENCH_RANDOM_KEYS_H_
#define KNNSERVE_BENCH_RANDOM_KEYS_H_

#include <cstdint>
#include <random>

#include "absl/status/status.h"
#include "common/datastore/key_source.h"

namespace knnserve {

// Row r: dim standard normal floats from a generator seeded by r alone, so any row range reads
// the same keys in any order.
class RandomKeySource : public KeySource {
 public:
  RandomKeySource(int64_t rows, int dim) : rows_(rows), dim_(dim) {}
  int64_t rows() const override { return rows_; }
  int dim() const override { return dim_; }
  absl::Status Read(int64_t begin, int64_t end, float* out) const override {
    for (int64_t r = begin; r < end; ++r) {
      std::mt19937 rng(static_cast<uint32_t>(r * 2654435761u));
      std::normal_distribution<float> normal;
      for (int d = 0; d < dim_; ++d) *out++ = normal(rng);
    }
    return absl::OkStatus();
  }

 private:
  const int64_t rows_;
  const int dim_;
};

}  // namespace knnserve

#endif  // KNNSERVE_BENCH_RANDOM_KEYS_H_
