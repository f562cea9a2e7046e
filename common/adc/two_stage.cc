#include "common/adc/two_stage.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace knnserve::adc_internal {
namespace {

constexpr int kLutSize = 256;

}  // namespace

void OfferBounded(Metric metric, int k, const Candidate& c, std::vector<Candidate>& heap) {
  auto ranks_before = [metric](const Candidate& a, const Candidate& b) {
    return RanksBefore(metric, a.first, a.second, b.first, b.second);
  };
  if (static_cast<int>(heap.size()) < k) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), ranks_before);
  } else if (ranks_before(c, heap.front())) {
    std::pop_heap(heap.begin(), heap.end(), ranks_before);
    heap.back() = c;
    std::push_heap(heap.begin(), heap.end(), ranks_before);
  }
}

void WriteNearestFirst(Metric metric, std::vector<Candidate>& heap, int64_t row, int k,
                       Neighbors& out) {
  std::sort_heap(heap.begin(), heap.end(), [metric](const Candidate& a, const Candidate& b) {
    return RanksBefore(metric, a.first, a.second, b.first, b.second);
  });
  for (size_t j = 0; j < heap.size(); ++j) {
    out.distances[row * k + j] = heap[j].first;
    out.ids[row * k + j] = heap[j].second;
  }
}

int64_t LutQuantization::LargestSumWithin(double cost) const {
  const double steps = std::floor((cost - base) / step) + slack;
  return static_cast<int64_t>(std::clamp(steps, -1.0, static_cast<double>(kKeepAll)));
}

// The bounds: an entry is floor((cost − min_m) / step) computed in float, so a vector's exact
// cost lies in [base + step * Q, base + step * (Q + m)) up to the rounding of the entries and
// of the exact scan's own sums; `slack` steps cover that rounding (from the table's magnitude)
// on either side, so the window is m + 2 slack steps wide.
LutQuantization QuantizeLut(const float* lut, int m_count, Metric metric, uint8_t* table) {
  const AdcTableKernels& kernels = BestAdcTableKernels();
  const float sign = metric == Metric::kL2 ? 1.0f : -1.0f;
  float lo[kMaxAdcM], hi[kMaxAdcM], mins[kMaxAdcM];
  kernels.row_ranges(lut, m_count, lo, hi);
  float widest = 0.0f;
  float magnitude = 0.0f;  // Σ_m max_c |lut[m][c]|
  double base = 0.0;
  for (int m = 0; m < m_count; ++m) {
    mins[m] = sign > 0 ? lo[m] : -hi[m];
    base += mins[m];
    widest = std::max(widest, hi[m] - lo[m]);
    magnitude += std::max(std::abs(lo[m]), std::abs(hi[m]));
  }
  LutQuantization q;
  q.step = widest / 255.0f;
  if (!(q.step > 0.0f) || !std::isfinite(q.step) || !std::isfinite(magnitude)) {
    std::fill(table, table + m_count * kLutSize, uint8_t{0});
    q.margin = LutQuantization::kKeepAll;
    return q;
  }
  kernels.quantize_rows(lut, m_count, sign, mins, 1.0f / q.step, table);
  const double rounding = 4.0 * (m_count + 2) * FLT_EPSILON * magnitude / q.step;
  q.base = static_cast<float>(base);
  q.slack = static_cast<int>(std::min<double>(LutQuantization::kKeepAll, 1 + std::ceil(rounding)));
  q.margin = std::min(LutQuantization::kKeepAll, m_count + 2 * q.slack);
  return q;
}

void CandidateFilter::Reset(int k, int margin, uint16_t cap) {
  k_ = k;
  margin_ = margin;
  cap_ = cap;
  limit_ = cap;
  if (counts_.empty()) counts_.resize(size_t{kNoLimit} + 1);
  if (touched_low_ <= touched_high_) {
    std::fill(counts_.begin() + touched_low_, counts_.begin() + touched_high_ + 1, 0u);
  }
  touched_low_ = kNoLimit;
  touched_high_ = 0;
  offered_ = 0;
  at_or_below_ = 0;
  kept_.clear();
  prune_at_ = 4 * static_cast<size_t>(k) + 1024;
}

void CandidateFilter::CountSum(uint16_t q) {
  ++counts_[q];
  touched_low_ = std::min(touched_low_, q);
  if (offered_ < k_) {
    // Later sums are counted only below the k-th, so the highest counted is one of these.
    touched_high_ = std::max(touched_high_, q);
    if (++offered_ < k_) return;
    // The k-th smallest of the first k: the largest of them.
    kth_ = touched_high_;
    at_or_below_ = k_;
  } else {
    ++at_or_below_;  // q < kth_
    // Down to the next counted sum while k lie strictly below the current one.
    while (at_or_below_ - counts_[kth_] >= k_) {
      at_or_below_ -= counts_[kth_];
      do {
        --kth_;
      } while (counts_[kth_] == 0);
    }
  }
  limit_ = static_cast<uint16_t>(std::min<int>(cap_, kth_ + margin_));
}

void CandidateFilter::Offer(const uint16_t* sums, uint64_t below, int64_t first_position) {
  for (; below != 0; below &= below - 1) {
    const int lane = __builtin_ctzll(below);
    const uint16_t q = sums[lane];
    if (q > limit_) continue;  // the limit fell inside this block
    kept_.emplace_back(q, first_position + lane);
    // Once k sums are counted, one at or above the k-th cannot lower it.
    if (k_ > 0 && (offered_ < k_ || q < kth_)) CountSum(q);
  }
  if (kept_.size() >= prune_at_) {
    Prune();
    prune_at_ = std::max(prune_at_, 2 * kept_.size());
  }
}

const std::vector<std::pair<uint16_t, int64_t>>& CandidateFilter::Survivors() {
  Prune();
  return kept_;
}

void CandidateFilter::Prune() {
  const uint16_t limit = limit_;
  kept_.erase(std::remove_if(kept_.begin(), kept_.end(),
                             [limit](const auto& c) { return c.first > limit; }),
              kept_.end());
}

AlignedVector<float> TransposeCentroids(const PqCodebook& codebook) {
  const int dsub = codebook.dsub;
  AlignedVector<float> transposed(codebook.centroids.size());
  for (int m = 0; m < codebook.m; ++m) {
    for (int c = 0; c < kLutSize; ++c) {
      for (int j = 0; j < dsub; ++j) {
        transposed[(static_cast<size_t>(m) * dsub + j) * kLutSize + c] =
            codebook.centroids[(static_cast<size_t>(m) * kLutSize + c) * dsub + j];
      }
    }
  }
  return transposed;
}

void CopyLaneCode(const PackedLine* block, int m_count, int lane, uint8_t* code) {
  for (int m = 0; m < m_count; ++m) code[m] = block[m].bytes[lane];
}

namespace {

// Scans that ask for the next block's lines while scanning this one: several queries (a
// beam), or more codes than stay cached between calls. Measured on this VM (M 32, caches
// flushed before each call, as the model flushes them between decoding steps): a beam's 5
// queries over a 14k-code subset took 155 us without and 77 us with (60 us with the codes
// already cached, 67 us with a useless prefetch); in decoding, the subset searches' time fell
// by 7-15%. One query: over a small IVF list nothing gained flushed and 20% lost cached; over
// packed subsets (index_bench b, M 64) 1.8 MiB lost 3-20%, 18 MiB and 244 MiB gained 0-18%.
constexpr int64_t kPrefetchAboveBytes = int64_t{8} << 20;

bool PrefetchesBlocks(int num_queries, int64_t n, int m_count) {
  return num_queries > 1 || n * m_count > kPrefetchAboveBytes;
}

void PrefetchBlock(const PackedLine* block, int m_count) {
  for (int m = 0; m < m_count; ++m) __builtin_prefetch(block[m].bytes, /*rw=*/0, /*locality=*/3);
}

// The most table bytes one pass over a run of blocks reads: the queries of a pass keep their
// tables in the L1 data cache while the codes stream past. A beam's five M = 64 tables (80 KiB)
// read for every block came from L2 and made the scan wait on table loads; beyond this, the
// queries are split into groups that each scan a run of blocks, whose codes then come from the
// L1/L2 caches for the next group.
constexpr int kTableBytesPerPass = 48 << 10;
constexpr int kBlocksPerRun = 8;

}  // namespace

void FilterPackedBlocks(const QuantizedAdcKernels& kernels, const uint8_t* const* tables,
                        int num_queries, const PackedLine* blocks, int64_t n, int m_count,
                        const uint16_t* const* biases, CandidateFilter* filters) {
  constexpr int kMaxQueries = 8;
  const int group = std::clamp(kTableBytesPerPass / (m_count * kLutSize), 1, kMaxQueries);
  // One block per run while a single pass holds every query: each block's limits are then the
  // freshest (a run's limits are those at its start; Offer rechecks the current limit).
  const int blocks_per_run = num_queries <= group ? 1 : kBlocksPerRun;
  uint16_t limits[kMaxQueries];
  alignas(64) uint16_t sums[kBlocksPerRun][kMaxQueries * kAdcBlock];
  uint64_t below[kBlocksPerRun][kMaxQueries];
  const uint16_t* block_biases[kMaxQueries];
  const bool prefetch = PrefetchesBlocks(num_queries, n, m_count);
  const int64_t run_positions = int64_t{blocks_per_run} * kAdcBlock;
  for (int64_t run = 0; run < n; run += run_positions) {
    const int64_t run_end = std::min(n, run + run_positions);
    for (int q = 0; q < num_queries; ++q) limits[q] = filters[q].limit();
    for (int first = 0; first < num_queries; first += group) {
      const int count = std::min(group, num_queries - first);
      for (int64_t b = run; b < run_end; b += kAdcBlock) {
        if (prefetch && first == 0 && b + kAdcBlock < n) {
          PrefetchBlock(blocks + (b / kAdcBlock + 1) * m_count, m_count);
        }
        for (int q = first; q < first + count && biases != nullptr; ++q) {
          block_biases[q] = biases[q] + b;
        }
        const int i = static_cast<int>((b - run) / kAdcBlock);
        kernels.scan(tables + first, count, blocks[b / kAdcBlock * m_count].bytes, m_count,
                     biases != nullptr ? block_biases + first : nullptr, limits + first,
                     sums[i] + first * kAdcBlock, below[i] + first);
      }
    }
    for (int64_t b = run; b < run_end; b += kAdcBlock) {
      const int i = static_cast<int>((b - run) / kAdcBlock);
      const int lanes = static_cast<int>(std::min<int64_t>(kAdcBlock, n - b));
      const uint64_t real_lanes = lanes == kAdcBlock ? ~uint64_t{0} : (uint64_t{1} << lanes) - 1;
      for (int q = 0; q < num_queries; ++q) {
        filters[q].Offer(sums[i] + q * kAdcBlock, below[i][q] & real_lanes, b);
      }
    }
  }
}

float SquaredL2(const float* a, const float* b, int d) {
  float acc[16] = {};
  int j = 0;
  for (; j + 16 <= d; j += 16) {
    for (int l = 0; l < 16; ++l) {
      const float x = a[j + l] - b[j + l];
      acc[l] += x * x;
    }
  }
  for (int l = 0; j + l < d; ++l) {
    const float x = a[j + l] - b[j + l];
    acc[l] += x * x;
  }
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  for (int l = 0; l < 4; ++l) acc[l] += acc[l + 4];
  for (int l = 0; l < 2; ++l) acc[l] += acc[l + 2];
  return acc[0] + acc[1];
}

float PackedCost(const float* lut, const PackedLine* blocks, int m_count, int64_t position) {
  uint8_t code[kMaxAdcM];
  CopyLaneCode(blocks + position / kAdcBlock * m_count, m_count,
               static_cast<int>(position % kAdcBlock), code);
  float cost;
  ScanScalar(&lut, 1, code, 1, m_count, &cost);
  return cost;
}

}  // namespace knnserve::adc_internal
