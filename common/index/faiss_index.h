// The faiss adapter: SearchIndex over any faiss index_factory string ("Flat", "IVF4096,PQ64",
// "OPQ64_256,IVF4096,PQ64", "PCA256,IVF65536_HNSW32,PQ64", ...), and the subset quantizer
// (the index's PCA/OPQ transform followed by an 8-bit product quantizer) that the subset ADC
// engine scans with. This file's .cc is the only one that calls faiss: every faiss exception is
// turned into an absl::Status there. Index files are faiss's own write_index format, readable
// by faiss itself (faiss.read_index).
//
// OpenMP: each object carries the OpenMP thread count its callers chose and sets it on the
// calling thread for every faiss call (ScopedOmpThreads: the caller's own count is restored
// after), because LibTorch in the same process sets OpenMP to one thread.
#ifndef KNNSERVE_COMMON_INDEX_FAISS_INDEX_H_
#define KNNSERVE_COMMON_INDEX_FAISS_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/adc/adc_kernels.h"
#include "common/adc/pq_codebook.h"
#include "common/files.h"
#include "common/index/search_index.h"

namespace faiss {
struct Index;
}  // namespace faiss

namespace knnserve {

class IvfAdc;

// Thread-safety: as SearchIndex.
class FaissIndex : public SearchIndex {
 public:
  // An untrained index of dimension `dim` from a faiss index_factory string. threads >= 1.
  static absl::StatusOr<std::unique_ptr<FaissIndex>> Create(const std::string& factory, int dim,
                                                            Metric metric, int threads);
  // Parses an index in faiss's write_index format (a Save()d file) that fills `in` exactly; errors
  // name `in`.
  static absl::StatusOr<std::unique_ptr<FaissIndex>> Read(ByteReader& in, int threads);
  // As Read, with the vectors dropped: the trained state (transform, coarse quantizer, PQ
  // codebooks) of a Save()d index, holding no vectors. Adding shards to an index directory
  // starts each new shard from one. FAILED_PRECONDITION naming `in` when it is not trained.
  static absl::StatusOr<std::unique_ptr<FaissIndex>> ReadTrainedEmpty(ByteReader& in, int threads);
  // Read + PrepareForServing(kernel), holding the index about once meanwhile: faiss's lists
  // become IvfAdc's packed lists (or CompactIds' lists) one list at a time, and faiss's
  // precomputed IVF-PQ table is computed only if faiss itself will scan the lists.
  static absl::StatusOr<std::unique_ptr<FaissIndex>> LoadForServing(ByteReader& in, int threads,
                                                                    AdcKernel kernel);
  ~FaissIndex() override;

  int dim() const override;
  Metric metric() const override;
  int64_t size() const override;
  bool is_trained() const override;
  absl::Status Train(MatrixView<const float> sample) override;
  absl::Status Add(MatrixView<const float> vectors) override;
  absl::StatusOr<Neighbors> Search(MatrixView<const float> queries,
                                   const SearchParams& params) const override;
  absl::StatusOr<FileDigest> Save(const std::string& path) const override;

  // A copy of this index with the same trained state and no vectors: every shard of a sharded
  // build starts from one. REQUIRES: is_trained() and size() == 0.
  absl::StatusOr<std::unique_ptr<FaissIndex>> CloneEmpty() const;

  // Freezes an IVF index into serving form: its inverted lists keep each vector's local id in 4
  // bytes instead of faiss's 8 (the shard's global id is its base + local id), so a shard costs
  // code bytes + 4 per vector. Afterwards Add and Save fail (faiss writes no such lists). Does
  // nothing for non-IVF indexes. REQUIRES: size() < 2^32.
  absl::Status CompactIds();
  // Serving form, called once after loading and before any search. An exact L2 index (Flat)
  // keeps its vectors' squared norms, which faiss's exact search otherwise recomputes (a scalar
  // pass over the whole index) at every call. IVF lists keep 4-byte local ids (CompactIds); with
  // a quantized `kernel` (adc_kernels.h), an IVF-PQ index with the L2 metric and residual 8-bit
  // codes is moreover searched by IvfAdc (common/adc/ivf_adc.h): the coarse assignment (and any
  // PCA/OPQ transform) stays faiss's, the list scan is the quantized two-stage scan over lists
  // packed here, and faiss's copy of the lists is released; its answers equal faiss's up to
  // float rounding. Afterwards Add and Save fail. The lists are moved, not copied:
  // after an error the index may have lost them and must be discarded. A second call does
  // nothing.
  absl::Status PrepareForServing(AdcKernel kernel);
  // Embedded mode: takes over the IvfAdc lists of `others` (shards of the same index
  // directory, each in serving form with IvfAdc: the same trained transform, coarse centroids
  // and codebook), their local ids shifted by id_offsets[i]; this index then searches them all
  // at once (one coarse search and one table per query and list instead of one per shard), with
  // answers equal to merging the shards' answers. Consumes `others`; on an error this index is
  // unchanged. REQUIRES: uses_ivf_adc().
  absl::Status AbsorbIvfLists(std::vector<std::unique_ptr<FaissIndex>> others,
                              const std::vector<int64_t>& id_offsets);
  // Whether searches scan the lists with IvfAdc (PrepareForServing).
  bool uses_ivf_adc() const { return ivf_adc_ != nullptr; }
  // Bytes per vector in the IVF inverted lists (codes + ids), or 0 for a non-IVF index.
  double InvertedListBytesPerVector() const;

  // Sets the training iterations of every OPQ rotation in the index's transform chain (faiss's
  // default is 50, slow on big samples). Call before Train.
  void SetOpqIterations(int iterations);

  // Which per-call SearchParams a search of this index uses; the others are ignored.
  struct UsedParams {
    bool nprobe = false;     // an IVF index (below any PCA/OPQ transform)
    bool ef_search = false;  // an HNSW index, or an IVF index whose coarse quantizer is HNSW
  };
  UsedParams used_params() const;

  // M of the index's product quantizer (IVFPQ, PQ), or 0 when it has none.
  int pq_m() const;
  int threads() const { return threads_; }
  const faiss::Index& faiss_index() const { return *index_; }

 private:
  FaissIndex(std::unique_ptr<faiss::Index> index, int threads);
  // Whether the IVF lists are IvfAdc's or hold 4-byte ids (serving form): faiss can neither add
  // to nor write them.
  bool ListsRepacked() const;
  // Read with faiss's IO_FLAG_* `io_flags`.
  static absl::StatusOr<std::unique_ptr<FaissIndex>> ReadIndex(ByteReader& in, int threads,
                                                               int io_flags);
  // The table faiss's IVF-PQ search uses (read_index computes it unless told not to), when
  // missing.
  absl::Status PrecomputeIvfPqTable();

  absl::StatusOr<Neighbors> SearchWithIvfAdc(MatrixView<const float> queries,
                                             const SearchParams& params) const;
  absl::StatusOr<Neighbors> SearchFlatWithNorms(MatrixView<const float> queries,
                                                const SearchParams& params) const;

  std::unique_ptr<faiss::Index> index_;
  const int threads_;
  std::unique_ptr<IvfAdc> ivf_adc_;  // set by PrepareForServing for eligible IVF-PQ indexes
  std::vector<float> flat_norms_;    // set by PrepareForServing for Flat L2 indexes
  // Set by PrepareForServing with IvfAdc when the coarse quantizer is an exact L2 Flat index:
  // its centroids' squared norms, for the coarse search.
  std::vector<float> coarse_norms_;
};

// The subset quantizer: the vector transforms of an index (its PCA/OPQ chain, or none) followed
// by an 8-bit product quantizer trained on the transformed sample. Codes are m bytes per
// vector. Stored as a faiss IndexPreTransform(chain, IndexPQ) without vectors.
// Thread-safety: const methods are safe from many threads at once.
class SubsetQuantizer {
 public:
  // Trains the product quantizer (m sub-quantizers, 256 centroids each) on `sample` passed
  // through `index`'s transform chain. The transformed dimension must be a multiple of m, and
  // sample needs at least 256 rows.
  static absl::StatusOr<std::unique_ptr<SubsetQuantizer>> Train(const FaissIndex& index, int m,
                                                                MatrixView<const float> sample,
                                                                int threads);
  // As FaissIndex::Read, for a Save()d subset quantizer.
  static absl::StatusOr<std::unique_ptr<SubsetQuantizer>> Read(ByteReader& in, int threads);
  ~SubsetQuantizer();

  int input_dim() const;  // dimension of keys and queries
  const PqCodebook& codebook() const { return codebook_; }

  // Applies the transform chain: rows x input_dim() -> rows x codebook().dim().
  absl::StatusOr<Matrix<float>> Transform(MatrixView<const float> x) const;
  // Transform + encode: rows x input_dim() -> rows x m codes.
  absl::StatusOr<Matrix<uint8_t>> Encode(MatrixView<const float> x) const;
  absl::StatusOr<FileDigest> Save(const std::string& path) const;

 private:
  SubsetQuantizer(std::unique_ptr<faiss::Index> index, int threads);

  std::unique_ptr<faiss::Index> index_;  // IndexPreTransform(chain, IndexPQ)
  const int threads_;
  PqCodebook codebook_;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_INDEX_FAISS_INDEX_H_
