// The pieces of the quantized two-stage scan shared by the subset (subset_adc.h) and IVF
// (ivf_adc.h) searches: byte tables quantized from a query's float table, the filter that keeps
// the scan positions whose integer sums may still be among the k nearest, the bounded
// k-selection heap, and access to one vector of a packed block. Internal to common/adc.
#ifndef KNNSERVE_COMMON_ADC_TWO_STAGE_H_
#define KNNSERVE_COMMON_ADC_TWO_STAGE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "common/adc/adc_kernels.h"
#include "common/adc/packed_lines.h"
#include "common/adc/pq_codebook.h"
#include "common/search_types.h"

namespace knnserve::adc_internal {

using Candidate = std::pair<float, int64_t>;  // distance, id

// Keeps the k candidates that rank first in a max-heap (the worst on top).
void OfferBounded(Metric metric, int k, const Candidate& c, std::vector<Candidate>& heap);
// Writes an OfferBounded heap nearest first into row `row` of out (consumes the heap).
void WriteNearestFirst(Metric metric, std::vector<Candidate>& heap, int64_t row, int k,
                       Neighbors& out);

// How a float table was quantized to bytes (QuantizeLut): with Q the integer sum of a vector's
// entries, its exact cost (the scalar scan's sum; −inner product for that metric) lies within
// [base + step * (Q − slack), base + step * (Q − slack + margin)).
struct LutQuantization {
  float base = 0.0f;  // Σ_m min_c cost[m][c]
  float step = 0.0f;
  int slack = 0;  // steps below Q that the float rounding can put the exact cost
  // The window's width in steps (m + 2 slack for QuantizeLut): a vector y can only be among the
  // k nearest if its lowest possible cost is at most the k-th smallest sum's highest,
  // Q_y − slack <= Q_k − slack + margin, i.e. Q_y <= Q_k + margin.
  // kKeepAll for a degenerate table (all entries equal, or not finite): keep every vector.
  int margin = 0;

  static constexpr int kKeepAll = 65535;
  bool keeps_all() const { return margin >= kKeepAll; }
  // The largest Q whose vector's exact cost can be <= `cost` (ties rank by id, so equal costs
  // must survive); negative when no vector can. REQUIRES: !keeps_all().
  int64_t LargestSumWithin(double cost) const;
};

// Quantizes one query's m_count x 256 float table to one byte per entry: per sub-quantizer m,
//   table[m][c] = floor((cost[m][c] − min_m) / step),  cost = lut (L2) or −lut (inner product,
// where larger is nearer), step = (widest row range) / 255, so entries fit a byte and sums of
// up to kMaxAdcM entries fit 16 bits.
LutQuantization QuantizeLut(const float* lut, int m_count, Metric metric, uint8_t* table);

// The positions (in scan order) whose quantized sum Q may still be among the k smallest exact
// costs: Q <= (k-th smallest Q offered so far) + margin, and Q <= an optional cap. Offer is
// called block by block; the limit only falls, so earlier survivors are pruned now and then.
// The k-th smallest sum is tracked with a count per sum value (a bounded heap of sums cost a
// sift per sum that beat it, ~k ln(n / k) of them: as much as the scan of a 5-query beam's
// subset, 14k codes at M = 32, in the demo's subset kNN-MT).
// Thread-safety: none (one per thread).
class CandidateFilter {
 public:
  // cap: no position with a larger sum can be wanted (e.g. from distances found elsewhere).
  // k = 0: the cap alone, no k-th smallest sum kept (for a cap known to be tight already).
  void Reset(int k, int margin, uint16_t cap = kNoLimit);

  uint16_t limit() const { return limit_; }
  // The k-th smallest sum offered so far; kNoLimit before k sums were offered.
  uint16_t kth_sum() const { return k_ == 0 || offered_ < k_ ? kNoLimit : kth_; }

  // sums: the kAdcBlock sums of the block at `first_position`; below: the lanes to consider.
  void Offer(const uint16_t* sums, uint64_t below, int64_t first_position);

  // The surviving (sum, position) pairs, in the order offered.
  const std::vector<std::pair<uint16_t, int64_t>>& Survivors();

 private:
  static constexpr uint16_t kNoLimit = 65535;

  // One more sum counted; the k-th smallest lowered while k sums lie below it.
  void CountSum(uint16_t q);
  void Prune();

  int k_ = 0;
  int margin_ = 0;
  uint16_t cap_ = kNoLimit;
  uint16_t limit_ = kNoLimit;
  // counts_[q]: sums q counted, nonzero only within [touched_low_, touched_high_] (cleared
  // there by Reset). Counted: the first k sums offered, then those below the k-th.
  std::vector<uint32_t> counts_;
  uint16_t touched_low_ = kNoLimit;
  uint16_t touched_high_ = 0;
  int offered_ = 0;                                 // sums counted, up to k
  uint16_t kth_ = 0;                                // once k are counted: the k-th smallest
  int64_t at_or_below_ = 0;                         // counted sums <= kth_
  std::vector<std::pair<uint16_t, int64_t>> kept_;  // (sum, position)
  size_t prune_at_ = 0;
};

// ||a − b||² of d floats, summed in the canonical order of the exact scans (16 partial sums,
// lane j taking elements j, j + 16, …, reduced as (j + 8), (j + 4), (j + 2), (j + 1)): partial
// sums the compiler vectorises (one sum in element order is a chain of d dependent additions),
// the same bits wherever it is called.
float SquaredL2(const float* a, const float* b, int d);

// The codebook's centroids transposed per sub-quantizer to dsub x 256, the layout AdcLutFn reads.
AlignedVector<float> TransposeCentroids(const PqCodebook& codebook);

// Copies the m_count code bytes of lane `lane` of a packed block to `code`.
void CopyLaneCode(const PackedLine* block, int m_count, int lane, uint8_t* code);

// Stage 1 over n packed positions (blocks of m_count lines each): the integer sums of every
// position for the num_queries tables (plus biases[q][position], saturating, when biases is
// not null), offered block by block to filters[q].
// REQUIRES: num_queries <= 8 (the quantized kernels' queries per pass); biases null or each
// biases[q] holding n values rounded up to whole blocks.
void FilterPackedBlocks(const QuantizedAdcKernels& kernels, const uint8_t* const* tables,
                        int num_queries, const PackedLine* blocks, int64_t n, int m_count,
                        const uint16_t* const* biases, CandidateFilter* filters);

// The exact cost through `lut` of the vector at `position` of the packed blocks (m_count lines
// per block): the scalar exact scan (ScanScalar) of its code, the same bits as every exact scan.
float PackedCost(const float* lut, const PackedLine* blocks, int m_count, int64_t position);

}  // namespace knnserve::adc_internal

#endif  // KNNSERVE_COMMON_ADC_TWO_STAGE_H_
