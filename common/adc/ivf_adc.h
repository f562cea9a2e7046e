// IvfAdc: the inverted lists of an IVF-PQ index (L2, residual 8-bit PQ codes) scanned with the
// quantized two-stage kernels (adc_kernels.h) instead of faiss's scalar table look-ups. The
// lists are packed once, when the index is loaded, so a search only builds tables and scans.
//
// A vector of list l is c_l + r (coarse centroid plus the PQ reconstruction r of its residual),
// so its squared distance to a query q is ||x||² + Σ_m (||r_m||² − 2⟨x_m, r_m⟩) with x = q − c_l:
// per (query, list) the m x 256 table of the second term is built (AdcTableKernels::
// residual_lut), quantized to bytes and scanned; the vectors that can still be among the k
// nearest (by the list's own bounds and by the k-th distance found in earlier lists) are
// re-ranked with the exact float sum (canonical order, adc_kernels.h). faiss computes the same
// distance as
// ||q − c_l||² + (||r||² + 2⟨c_l, r⟩) − 2⟨q, r⟩ from a precomputed nlist x m x 256 table: equal
// up to float rounding. Building the residual table costs arithmetic instead of reading that
// table (32 KiB per list at m = 32) from memory, and the table is not kept. The answers are
// bit-identical whichever quantized kernel runs.
#ifndef KNNSERVE_COMMON_ADC_IVF_ADC_H_
#define KNNSERVE_COMMON_ADC_IVF_ADC_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/adc/adc_kernels.h"
#include "common/adc/pq_codebook.h"
#include "common/matrix.h"
#include "common/search_types.h"

namespace knnserve {

namespace adc_internal {
struct PackedLine;
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
  // coarse lists of each row, nearest first (−1: none). Returns rows x k neighbours with local
  // ids and squared L2 distances, RanksBefore order, missing ones at the end (WorstDistance,
  // id −1).
  absl::StatusOr<Neighbors> Search(MatrixView<const float> queries,
                                   MatrixView<const int64_t> probes, int k) const;

  int dim() const { return codebook_.dim(); }
  int64_t size() const { return static_cast<int64_t>(ids_.size()); }
  // Bytes held per vector: packed codes (lists padded to whole blocks) and 4-byte ids.
  double BytesPerVector() const;

 private:
  struct Scratch;
  IvfAdc(PqCodebook codebook, std::vector<float> coarse_centroids, Options options);

  void SearchRow(const float* query, const int64_t* probes, int nprobe, int k, Scratch& scratch,
                 int64_t row, Neighbors& out) const;

  const PqCodebook codebook_;
  const std::vector<float> coarse_centroids_;
  const Options options_;
  const QuantizedAdcKernels kernels_;
  const AdcScanFn exact_;  // the re-rank: any exact kernel gives the scalar sums bit for bit
  const AdcTableKernels& tables_;
  const std::vector<float> centroids_t_;
  std::vector<float>
      norms_;  // m x 256: ||r_mj||²  // per sub-quantizer dsub x 256 (AdcLutFn's layout)
  // List l: blocks [block_begin_[l], block_begin_[l + 1]) of m lines each, and vectors
  // [list_begin_[l], list_begin_[l + 1]) of ids_.
  std::vector<adc_internal::PackedLine> lines_;
  std::vector<int64_t> block_begin_;
  std::vector<int64_t> list_begin_;
  std::vector<uint32_t> ids_;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_ADC_IVF_ADC_H_
