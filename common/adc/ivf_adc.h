// IvfAdc: the inverted lists of an IVF-PQ index (L2, residual 8-bit PQ codes) scanned with the
// quantized two-stage kernels (adc_kernels.h) instead of faiss's scalar table look-ups. The
// lists are packed once, when the index is loaded, so a search only builds tables and scans.
//
// A vector of list l is c_l + r (coarse centroid plus the PQ reconstruction r of its residual),
// so its squared distance to a query q is, with x = q − c_l,
//   ||x||² + Σ_m (||r_m||² − 2⟨x_m, r_m⟩)
//   = ||x||² + (b + Σ_m T[m][code_m]),  b = Σ_m (||r_m||² + 2⟨c_l,m, r_m⟩), T = −2⟨q_m, centroid⟩.
// The second form is the distance IvfAdc returns, in float: ||x||² per (query, list), b per
// vector (fixed at load, 4 bytes), T one m x 256 table per query, summed in the canonical order
// (adc_kernels.h). The pre-scan quantizes T to bytes for all lists of the query and adds each
// vector's b in table steps to the integer sums. The bounds of both terms (with float rounding)
// decide which vectors can still be among the k nearest: by the list's own k-th sum (until a cap
// exists), by the k-th exact distance found and by the k-th smallest upper bound of the
// distances of all survivors so far. Survivors get their exact distance (m look-ups in T): a
// list's at once until k exact distances are known, the later ones once every probed list is
// scanned, nearest lower bound first, until the next lower bound exceeds the k-th exact distance
// found. A list whose sums could overflow 16 bits has every vector costed instead: the same
// distances. faiss computes ||q − c_l||² + (||r||² + 2⟨c_l, r⟩) − 2⟨q, r⟩ from a precomputed
// nlist x m x 256 table: equal up to float rounding. The answers are bit-identical whichever
// quantized kernel runs, and whichever shards the vectors are split into (a vector's distance
// depends on the vector and the query alone).
#ifndef KNNSERVE_COMMON_ADC_IVF_ADC_H_
#define KNNSERVE_COMMON_ADC_IVF_ADC_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/adc/adc_kernels.h"
#include "common/adc/packed_lines.h"
#include "common/adc/pq_codebook.h"
#include "common/matrix.h"
#include "common/search_types.h"

namespace knnserve {

namespace adc_internal {
struct LutQuantization;
class CandidateFilter;
}  // namespace adc_internal

// What IvfAdc needs of a trained, filled IVF-PQ index (copied out of faiss by the adapter).
struct IvfPqLists {
  PqCodebook codebook;  // the residual product quantizer (8-bit)
  // nlist x codebook.dim(): the coarse centroids c_l.
  std::vector<float> coarse_centroids;
  // Per list: its vectors' codes (size x m bytes, vector after vector) and local ids.
  std::vector<std::vector<uint8_t>> codes;
  std::vector<std::vector<uint32_t>> ids;

  int nlist() const { return static_cast<int>(ids.size()); }
};

// Thread-safety: immutable after Create; Search is const and safe from many threads.
class IvfAdc {
 public:
  struct Options {
    int threads = 1;                                 // OpenMP threads across query rows
    AdcKernel kernel = AdcKernel::kQuantizedScalar;  // REQUIRES: IsQuantized, CpuSupports
  };

  // Packs the lists (consuming `lists`). Fails on inconsistent sizes or an unusable kernel.
  static absl::StatusOr<std::unique_ptr<IvfAdc>> Create(IvfPqLists lists, Options options);
  // One IvfAdc holding the lists of `parts` (shards of one trained index: same coarse
  // centroids and codebook, else FAILED_PRECONDITION), part i's ids shifted by id_offsets[i].
  // Its searches equal merging the parts' answers exactly: every vector gets the same table and
  // distance either way. Uses parts[0]'s options. The parts are consumed (reset) on success
  // and left untouched on an error.
  static absl::StatusOr<std::unique_ptr<IvfAdc>> Merge(std::vector<std::unique_ptr<IvfAdc>>* parts,
                                                       const std::vector<int64_t>& id_offsets);
  ~IvfAdc();

  // queries: rows x dim() (after the index's transform, if any). probes: rows x nprobe, the
  // coarse lists of each row, nearest first (−1: none; a list named twice is searched once).
  // Returns rows x k neighbours with local ids and squared L2 distances, RanksBefore order,
  // missing ones at the end (WorstDistance, id −1).
  absl::StatusOr<Neighbors> Search(MatrixView<const float> queries,
                                   MatrixView<const int64_t> probes, int k) const;

  int dim() const { return codebook_.dim(); }
  int64_t size() const { return static_cast<int64_t>(ids_.size()); }
  // Bytes held per vector: packed codes (lists padded to whole blocks), 4-byte ids and 4-byte
  // biases.
  double BytesPerVector() const;

 private:
  struct Pending;
  struct Row;
  struct ListVisit;
  struct Scratch;
  IvfAdc(PqCodebook codebook, std::vector<float> coarse_centroids, Options options);

  // Fills biases_ (each vector's b) and each list's smallest and largest b.
  void ComputeBiases(const std::vector<std::vector<uint8_t>>& codes);
  // Rows [first, first + num) of out: the k nearest of those queries over their probed lists.
  // The rows are searched together: each of their probed lists is scanned once for all the rows
  // that probe it.
  void SearchRows(MatrixView<const float> queries, MatrixView<const int64_t> probes, int64_t first,
                  int num, int k, Scratch& scratch, Neighbors& out) const;
  // scratch.rows[0, num): the tables (T in float and quantized) and an empty search state of
  // rows [first, first + num).
  void SetUpRows(MatrixView<const float> queries, MatrixView<const int64_t> probes, int64_t first,
                 int num, Scratch& scratch) const;
  // Pre-scans `list` for the rows of visits[0, count) (all probing it), up to kPassRows rows per
  // pass over its codes. Survivors join each row's pending.
  void ScanList(int64_t list, const ListVisit* visits, int count, int k, Scratch& scratch) const;
  // The bounds of a row's pre-scan sums over `list` (query table quantized as `query_bounds`;
  // x_norm = ||q − c||²): false when the sums could overflow 16 bits.
  bool ListBounds(int64_t list, float x_norm, double query_norm,
                  const adc_internal::LutQuantization& query_bounds,
                  adc_internal::LutQuantization* bounds) const;
  // Asks for the cache lines of `list`'s biases (read by BiasSteps once per row scanning it).
  void PrefetchBiases(int64_t list) const;
  // Each vector's b of `list` in table steps of `step` above the list's smallest b, then zeros
  // up to a whole block.
  void BiasSteps(int64_t list, double step, adc_internal::AlignedVector<uint16_t>& out) const;
  // Adds the survivors of `filter` (its scan of `list` with `bounds`) to row.pending.
  void DeferSurvivors(int probe, int64_t list, const adc_internal::LutQuantization& bounds, int k,
                      adc_internal::CandidateFilter& filter, Row& row) const;
  // Offers every vector of `list` at its exact distance (x_norm = ||q − c_list||²).
  void CostWholeList(int64_t list, float x_norm, int k, Row& row) const;
  // The exact distance of a vector of a list: x_norm + (b + the sum of its code's entries of the
  // query's float table lut).
  float Distance(float x_norm, float bias, const uint8_t* code, const float* lut) const;
  // Exact distances of row.pending, nearest lower bound first, while they can still rank.
  void RerankPending(int k, Row& row) const;
  // Offers local id `id` at its exact distance to row.heap.
  void OfferExact(uint32_t id, float distance, int k, Row& row) const;
  // Records an upper bound of a vector's distance (each vector at most once per row) and
  // lowers row.kth_bound to the k-th smallest recorded.
  void OfferUpperBound(double upper, int k, Row& row) const;
  // An upper bound of the row's k-th distance: the smaller of row.kth_bound and the k-th exact
  // distance found (infinite while neither is known).
  double KthBound(int k, const Row& row) const;

  const PqCodebook codebook_;
  const std::vector<float> coarse_centroids_;
  const Options options_;
  const QuantizedAdcKernels kernels_;
  const AdcTableKernels& tables_;
  // Read 64 bytes at a time by the table kernels, hence aligned (packed_lines.h).
  const adc_internal::AlignedVector<float> centroids_t_;  // per sub-quantizer dsub x 256
  adc_internal::AlignedVector<float> norms_;              // m x 256: ||r_mc||²
  const adc_internal::AlignedVector<float> zeros_;  // m x 256 zeros: residual_luts' start for T
  float norms_max_sum_ = 0.0f;                      // Σ_m max_c ||r_mc||²
  float centroid_bound_ = 0.0f;  // sqrt(Σ_m max_c ||r_mc||²) (Cauchy-Schwarz bounds)
  // List l: blocks [block_begin_[l], block_begin_[l + 1]) of m lines each, and vectors
  // [list_begin_[l], list_begin_[l + 1]) of ids_.
  adc_internal::PackedLines lines_;
  std::vector<int64_t> block_begin_;
  std::vector<int64_t> list_begin_;
  std::vector<uint32_t> ids_;
  // Per vector (as ids_), its b; per list, the smallest and largest.
  std::vector<float> biases_;
  std::vector<float> bias_min_;
  std::vector<float> bias_max_;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_ADC_IVF_ADC_H_
