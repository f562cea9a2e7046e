// Subset ADC: k-nearest-neighbour search restricted to the tokens of given sentences, over
// 8-bit PQ codes stored grouped by sentence (the core of subset kNN-MT; faiss cannot search a
// dynamic subset without scanning everything).
//
// Per query the m x 256 distance table (LUT) is built once; the queries of one subset group (a
// beam) share one pass over the codes of the group's sentences; k-selection keeps a bounded
// heap per query. The scan kernel is picked at run time (adc_kernels.h) and gives identical
// answers whichever it is: the exact kernels bit-identical distances for every code, the
// quantized ones an integer pre-scan whose bounds let only possible top-k codes through to the
// exact scalar distance.
#ifndef KNNSERVE_COMMON_ADC_SUBSET_ADC_H_
#define KNNSERVE_COMMON_ADC_SUBSET_ADC_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/adc/adc_kernels.h"
#include "common/adc/packed_lines.h"
#include "common/adc/pq_codebook.h"
#include "common/matrix.h"
#include "common/request.h"
#include "common/search_types.h"

namespace knnserve {
namespace adc_internal {
class CandidateFilter;
struct LutQuantization;
}  // namespace adc_internal

// PQ codes of the contiguous sentence range [sentence_begin, sentence_begin + num_sentences()),
// whose tokens are the contiguous global ids [token_begin, token_begin + num_vectors()).
struct SubsetCodes {
  int m = 0;                     // code bytes per vector
  int64_t sentence_begin = 0;    // global id of the first sentence
  int64_t token_begin = 0;       // global token id of the first code
  std::vector<int64_t> offsets;  // num_sentences() + 1 local token offsets, offsets[0] == 0
  std::vector<uint8_t> codes;    // num_vectors() x m, sentence after sentence

  int64_t num_sentences() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t num_vectors() const { return offsets.empty() ? 0 : offsets.back(); }
  int64_t sentence_end() const { return sentence_begin + num_sentences(); }
};

// The local token ranges [begin, end) holding `sentences` (global ids) of `codes`' slice: those
// outside the slice dropped, sorted, adjacent sentences merged into one range, empty ones
// skipped. Shared by the CPU and GPU scans so both visit tokens in the same order.
void SubsetRanges(const SubsetCodes& codes, absl::Span<const int64_t> sentences,
                  std::vector<std::pair<int64_t, int64_t>>& ranges);

// The argument checks of SubsetAdc::SearchSubset (and its GPU twin): queries have `dim`
// columns, k > 0, one row_group entry per query row, each naming an existing group.
absl::Status CheckSubsetSearch(int dim, MatrixView<const float> queries, const SubsetGroups& groups,
                               absl::Span<const int32_t> row_group, int k);

// The neighbours of a subset search (global token ids) and how many codes were scanned.
struct SubsetResult {
  Neighbors neighbors;
  int64_t vectors_scanned = 0;
};

// What an engine needs of a subset ADC engine, on the CPU (SubsetAdc) or a GPU (CudaSubsetAdc).
// Thread-safety: implementations are immutable; SearchSubset is const and safe from many threads.
class SubsetSearcher {
 public:
  virtual ~SubsetSearcher() = default;
  // As SubsetAdc::SearchSubset.
  virtual absl::StatusOr<SubsetResult> SearchSubset(
      MatrixView<const float> queries, const std::shared_ptr<const SubsetGroups>& groups,
      absl::Span<const int32_t> row_group, int k) const = 0;
};

// Thread-safety: immutable after Create; SearchSubset is const and safe from many threads.
class SubsetAdc : public SubsetSearcher {
 public:
  struct Options {
    int threads = 1;                     // OpenMP threads across subset groups
    AdcKernel kernel = BestAdcKernel();  // must be supported by this CPU
    // Quantized kernels: bytes of packed subsets kept between calls (a subset kNN-MT session
    // searches the same sentences at every step), least recently used out, and those of groups
    // that nobody holds any more soon after (see SearchSubset); 0 keeps none.
    size_t packed_cache_bytes = size_t{256} << 20;
  };

  // Checks that the codes match the codebook and the offsets are consistent.
  static absl::StatusOr<std::unique_ptr<SubsetAdc>> Create(PqCodebook codebook, Metric metric,
                                                           SubsetCodes codes, Options options);
  ~SubsetAdc() override;

  // queries: rows x codebook().dim(), already passed through the quantizer's transform.
  // Row r may match the tokens of the sentences groups[row_group[r]] (global sentence ids,
  // any order, distinct); sentences outside this slice are skipped (another shard holds them).
  // Returns rows x k neighbours in RanksBefore order with global token ids; distances are the
  // ADC approximations (squared L2 or inner product in the transformed space).
  // REQUIRES: groups != nullptr. The subsets packed for the groups stay cached while some caller
  // still holds `groups` (a session's: pass the same pointer at every step), or while calls with
  // equal groups under other pointers (a unary client's requests) find them between two sweeps
  // of the cache (which run every eighth of its entries packed); otherwise they are dropped by
  // the next sweep once nobody holds them.
  absl::StatusOr<SubsetResult> SearchSubset(MatrixView<const float> queries,
                                            const std::shared_ptr<const SubsetGroups>& groups,
                                            absl::Span<const int32_t> row_group,
                                            int k) const override;

  // The m x 256 table of `query` (codebook().dim() floats): per sub-quantizer and centroid, the
  // squared L2 distance (or inner product) of the query's sub-vector to the centroid.
  void ComputeLut(const float* query, float* lut) const;

  const PqCodebook& codebook() const { return codebook_; }
  const SubsetCodes& codes() const { return codes_; }
  // Bytes of packed subsets the cache holds now.
  size_t packed_bytes_cached() const;
  Metric metric() const { return metric_; }
  AdcKernel kernel() const { return options_.kernel; }

 private:
  SubsetAdc(PqCodebook codebook, Metric metric, SubsetCodes codes, Options options);

  struct Scratch;
  struct PackedSubset;
  class PackedCache;
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  // The codes of `ranges` (local token runs) packed for the quantized scan: from the cache, or
  // packed now (and cached for `owner` if it fits the cache; otherwise into memory of `scratch`,
  // reused by its next call).
  std::shared_ptr<const PackedSubset> Packed(const Ranges& ranges,
                                             const std::shared_ptr<const SubsetGroups>& owner,
                                             Scratch& scratch) const;
  // Searches the rows of one group (its sentences) into `out`; returns the number of codes
  // scanned. The exact float scan, and the quantized two-stage scan (for IsQuantized kernels),
  // whose packed subset is cached for `owner` (the groups `sentences` belongs to).
  int64_t SearchGroup(MatrixView<const float> queries, absl::Span<const int64_t> sentences,
                      absl::Span<const int64_t> rows, int k, Scratch& scratch,
                      Neighbors& out) const;
  int64_t SearchGroupQuantized(MatrixView<const float> queries, absl::Span<const int64_t> sentences,
                               const std::shared_ptr<const SubsetGroups>& owner,
                               absl::Span<const int64_t> rows, int k, Scratch& scratch,
                               Neighbors& out) const;
  // Stage 2 of one query: the k nearest of filter's survivors into heap (OfferBounded's form),
  // their exact distances through lut, quantized as `quantization` for the scan.
  void RankSurvivors(const float* lut, const adc_internal::LutQuantization& quantization,
                     const PackedSubset& packed, int k, adc_internal::CandidateFilter& filter,
                     std::vector<std::pair<float, int64_t>>& heap) const;

  const PqCodebook codebook_;
  const Metric metric_;
  const SubsetCodes codes_;
  const Options options_;
  const AdcScanFn scan_;
  const QuantizedAdcKernels quantized_;  // null functions unless IsQuantized(options_.kernel)
  const AdcLutFn lut_;
  const std::unique_ptr<PackedCache> cache_;  // null when options_.packed_cache_bytes == 0
  // Per sub-quantizer, centroids transposed to dsub x 256 so LUT building vectorises.
  adc_internal::AlignedVector<float> centroids_t_;  // aligned: read 64 bytes at a time
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_ADC_SUBSET_ADC_H_
