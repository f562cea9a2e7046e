// The one file that calls faiss. Every entry point runs its faiss calls inside Guard(), which
// turns faiss::FaissException (and anything else faiss throws) into an absl::Status.
#include "common/index/faiss_index.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <numeric>
#include <typeinfo>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/adc/ivf_adc.h"
#include "common/check.h"
#include "common/heap.h"
#include "common/omp_threads.h"
#include "common/parallel_exceptions.h"
#include "common/status_macros.h"
#include "faiss/IndexFlat.h"
#include "faiss/IndexHNSW.h"
#include "faiss/IndexIVF.h"
#include "faiss/IndexIVFPQ.h"
#include "faiss/IndexPQ.h"
#include "faiss/IndexPreTransform.h"
#include "faiss/VectorTransform.h"
#include "faiss/clone_index.h"  // Cloner for the subset quantizer's transforms
#include "faiss/impl/FaissException.h"
#include "faiss/impl/io.h"
#include "faiss/index_factory.h"
#include "faiss/index_io.h"
#include "faiss/invlists/InvertedLists.h"
#include "faiss/utils/distances.h"

namespace knnserve {
namespace {

using idx_t = faiss::Index::idx_t;

// Runs `body` with OpenMP set to `threads` on this thread, converting exceptions to a Status
// that says what was being done.
template <typename Body>
absl::Status Guard(absl::string_view what, int threads, Body&& body) {
  const ScopedOmpThreads scoped_threads(threads);
  try {
    body();
    return absl::OkStatus();
  } catch (const faiss::FaissException& e) {
    return absl::InvalidArgumentError(absl::StrCat("faiss: ", what, ": ", e.msg));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("faiss: ", what, ": out of memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("faiss: ", what, ": ", e.what()));
  }
}

faiss::MetricType ToFaiss(Metric metric) {
  return metric == Metric::kL2 ? faiss::METRIC_L2 : faiss::METRIC_INNER_PRODUCT;
}

absl::Status CheckThreads(int threads) {
  if (threads < 1) return absl::InvalidArgumentError(absl::StrCat("threads = ", threads));
  return absl::OkStatus();
}

absl::Status CheckCols(MatrixView<const float> m, int dim, absl::string_view what) {
  if (m.cols != dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " have dimension ", m.cols, ", the index has ", dim));
  }
  return absl::OkStatus();
}

// The index below any IndexPreTransform.
const faiss::Index* Unwrap(const faiss::Index* index) {
  if (auto* pre = dynamic_cast<const faiss::IndexPreTransform*>(index)) return pre->index;
  return index;
}

// Per-call search parameters for the index nesting faiss builds from factory strings:
// [PreTransform ->] IVF (quantizer maybe HNSW) | HNSW | anything else. nprobe/ef_search of 0
// keep the index's own settings; faiss's parameter structs default to nprobe 1, so the index's
// value is copied in explicitly.
class ParamChain {
 public:
  ParamChain(const faiss::Index* index, const SearchParams& params) {
    faiss::SearchParameters* inner = nullptr;
    const faiss::Index* base = Unwrap(index);
    if (auto* ivf = dynamic_cast<const faiss::IndexIVF*>(base)) {
      ivf_.nprobe = params.nprobe > 0 ? params.nprobe : ivf->nprobe;
      if (params.ef_search > 0 && dynamic_cast<const faiss::IndexHNSW*>(ivf->quantizer)) {
        hnsw_.efSearch = params.ef_search;
        ivf_.quantizer_params = &hnsw_;
      }
      inner = &ivf_;
    } else if (auto* hnsw = dynamic_cast<const faiss::IndexHNSW*>(base)) {
      hnsw_.efSearch = params.ef_search > 0 ? params.ef_search : hnsw->hnsw.efSearch;
      inner = &hnsw_;
    }
    if (inner != nullptr && base != index) {
      pre_.index_params = inner;
      top_ = &pre_;
    } else {
      top_ = inner;
    }
  }
  ParamChain(const ParamChain&) = delete;
  ParamChain& operator=(const ParamChain&) = delete;

  const faiss::SearchParameters* get() const { return top_; }
  // The IVF level's nprobe and its coarse quantizer's parameters (nullptr: its defaults).
  int nprobe() const { return ivf_.nprobe; }
  const faiss::SearchParameters* quantizer() const { return ivf_.quantizer_params; }

 private:
  faiss::SearchParametersPreTransform pre_;
  faiss::SearchParametersIVF ivf_;
  faiss::SearchParametersHNSW hnsw_;
  const faiss::SearchParameters* top_ = nullptr;
};

// faiss marks missing results with id -1 and FLT_MAX-like distances, and orders ties
// arbitrarily; shards must agree exactly with an unsharded index, so rows are normalised to
// RanksBefore order with WorstDistance for missing entries.
void NormaliseRows(Metric metric, Neighbors& out) {
  std::vector<int> order(out.k);
  std::vector<float> dist(out.k);
  std::vector<int64_t> ids(out.k);
  for (int64_t r = 0; r < out.rows; ++r) {
    float* d = out.distances.data() + r * out.k;
    int64_t* id = out.ids.data() + r * out.k;
    for (int j = 0; j < out.k; ++j) {
      if (id[j] < 0) d[j] = WorstDistance(metric);
    }
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return RanksBefore(metric, d[a], id[a], d[b], id[b]); });
    for (int j = 0; j < out.k; ++j) {
      dist[j] = d[order[j]];
      ids[j] = id[order[j]];
    }
    std::copy(dist.begin(), dist.end(), d);
    std::copy(ids.begin(), ids.end(), id);
  }
}

// Moves list `l` of `from` into `codes` and `ids` (as 32-bit local ids), leaving it empty, so
// that a shard's lists are held once while they change form: an ArrayInvertedLists (what faiss
// reads and builds) hands its codes over without a copy; other lists are copied.
void TakeList(faiss::InvertedLists& from, size_t l, std::vector<uint8_t>& codes,
              std::vector<uint32_t>& ids) {
  if (auto* array = dynamic_cast<faiss::ArrayInvertedLists*>(&from)) {
    codes = std::exchange(array->codes[l], std::vector<uint8_t>());
    ids.assign(array->ids[l].begin(), array->ids[l].end());
    FreeVector(array->ids[l]);
    return;
  }
  const size_t n = from.list_size(l);
  faiss::InvertedLists::ScopedCodes list_codes(&from, l);
  faiss::InvertedLists::ScopedIds list_ids(&from, l);
  codes.assign(list_codes.get(), list_codes.get() + n * from.code_size);
  ids.assign(list_ids.get(), list_ids.get() + n);
}

// Read-only inverted lists with 4-byte local ids. faiss asks for a list's ids through
// get_ids/release_ids (the hook faiss's on-disk lists use), so the 8-byte ids it scans with are
// materialised per probed list, per call: thread-safe, and small next to scanning the codes.
class CompactInvertedLists : public faiss::ReadOnlyInvertedLists {
 public:
  // Takes the lists of `from`, leaving them empty (TakeList).
  explicit CompactInvertedLists(faiss::InvertedLists& from)
      : faiss::ReadOnlyInvertedLists(from.nlist, from.code_size),
        codes_(from.nlist),
        ids_(from.nlist) {
    for (size_t l = 0; l < from.nlist; ++l) TakeList(from, l, codes_[l], ids_[l]);
  }

  size_t list_size(size_t list_no) const override { return ids_[list_no].size(); }
  const uint8_t* get_codes(size_t list_no) const override { return codes_[list_no].data(); }
  const idx_t* get_ids(size_t list_no) const override {
    const std::vector<uint32_t>& ids = ids_[list_no];
    auto* out = new idx_t[ids.size()];
    std::copy(ids.begin(), ids.end(), out);
    return out;
  }
  void release_ids(size_t /*list_no*/, const idx_t* ids) const override { delete[] ids; }
  idx_t get_single_id(size_t list_no, size_t offset) const override {
    return ids_[list_no][offset];
  }

 private:
  std::vector<std::vector<uint8_t>> codes_;
  std::vector<std::vector<uint32_t>> ids_;
};

// faiss's reader over a ByteReader, with fread's semantics (whole items; fewer at the end). A
// read error is kept: faiss's own message ("read error") would hide it.
class FaissByteReader : public faiss::IOReader {
 public:
  explicit FaissByteReader(ByteReader& in) : in_(in) { name = in.name(); }
  size_t operator()(void* ptr, size_t size, size_t nitems) override {
    if (size == 0 || nitems == 0 || !error_.ok()) return 0;
    const size_t items = std::min<uint64_t>(nitems, in_.remaining() / size);
    absl::StatusOr<size_t> n = in_.Read(ptr, items * size);
    if (!n.ok()) {
      error_ = n.status();
      return 0;
    }
    return *n / size;
  }
  const absl::Status& error() const { return error_; }

 private:
  ByteReader& in_;
  absl::Status error_;
};

// faiss's writer into an AtomicFileWriter, through a 1 MiB buffer (faiss writes every scalar
// field on its own). A write error is kept, as FaissByteReader keeps a read error.
class FaissFileWriter : public faiss::IOWriter {
 public:
  explicit FaissFileWriter(AtomicFileWriter& out) : out_(out) { buffer_.reserve(kBufferBytes); }
  size_t operator()(const void* ptr, size_t size, size_t nitems) override {
    const size_t bytes = size * nitems;
    if (bytes == 0 || !error_.ok()) return 0;
    if (buffer_.size() + bytes > kBufferBytes && !Flush().ok()) return 0;
    if (bytes >= kBufferBytes) {  // a whole list or array: straight to the file
      error_ = out_.Append(ptr, bytes);
      return error_.ok() ? nitems : 0;
    }
    const auto* p = static_cast<const char*>(ptr);
    buffer_.insert(buffer_.end(), p, p + bytes);
    return nitems;
  }
  absl::Status Flush() {
    if (error_.ok() && !buffer_.empty()) error_ = out_.Append(buffer_.data(), buffer_.size());
    buffer_.clear();
    return error_;
  }
  const absl::Status& error() const { return error_; }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  AtomicFileWriter& out_;
  std::vector<char> buffer_;
  absl::Status error_;
};

// Streams the index into `path` (atomically): no serialized copy of it is held.
absl::StatusOr<FileDigest> SaveFaiss(const faiss::Index* index, const std::string& path) {
  ASSIGN_OR_RETURN(const std::unique_ptr<AtomicFileWriter> out, AtomicFileWriter::Create(path));
  FaissFileWriter writer(*out);
  const absl::Status s =
      Guard(absl::StrCat("write_index ", path), 1, [&] { faiss::write_index(index, &writer); });
  RETURN_IF_ERROR(writer.error());
  RETURN_IF_ERROR(s);
  RETURN_IF_ERROR(writer.Flush());
  return out->Commit();
}

// Parses an index in write_index format from `in`, which it must fill exactly. io_flags: faiss's
// IO_FLAG_* (index_io.h).
absl::StatusOr<std::unique_ptr<faiss::Index>> ReadFaiss(ByteReader& in, int io_flags = 0) {
  FaissByteReader reader(in);
  std::unique_ptr<faiss::Index> index;
  const absl::Status s = Guard(absl::StrCat("read_index ", in.name()), 1,
                               [&] { index.reset(faiss::read_index(&reader, io_flags)); });
  RETURN_IF_ERROR(reader.error());
  RETURN_IF_ERROR(s);
  if (in.remaining() != 0) {
    return absl::DataLossError(
        absl::StrCat(in.name(), ": ", in.remaining(), " bytes after the end of the index"));
  }
  return index;
}

// The IVF-PQ index under `index` if IvfAdc can scan it: exactly an IndexIVFPQ (not a subclass
// with its own search, such as IVFPQR), L2, residual 8-bit codes, no polysemous filtering.
faiss::IndexIVFPQ* IvfAdcCandidate(faiss::Index* index) {
  auto* ivfpq = dynamic_cast<faiss::IndexIVFPQ*>(const_cast<faiss::Index*>(Unwrap(index)));
  if (ivfpq == nullptr || typeid(*ivfpq) != typeid(faiss::IndexIVFPQ)) return nullptr;
  const faiss::ProductQuantizer& pq = ivfpq->pq;
  const bool eligible = ivfpq->metric_type == faiss::METRIC_L2 && ivfpq->by_residual &&
                        pq.nbits == 8 && static_cast<int>(pq.M) <= kMaxAdcM &&
                        ivfpq->polysemous_ht == 0 && ivfpq->ntotal < (int64_t{1} << 32);
  return eligible ? ivfpq : nullptr;
}

// `index` itself if it is an exact L2 IndexFlat (no transform, not a subclass with its own
// search).
const faiss::IndexFlat* ExactL2Flat(const faiss::Index* index) {
  const auto* flat = dynamic_cast<const faiss::IndexFlat*>(index);
  const bool exact =
      flat != nullptr && flat->metric_type == faiss::METRIC_L2 &&
      (typeid(*flat) == typeid(faiss::IndexFlat) || typeid(*flat) == typeid(faiss::IndexFlatL2));
  return exact ? flat : nullptr;
}

// The squared norms of an exact L2 Flat index's vectors, which faiss's exact search otherwise
// recomputes (a scalar pass over all of them) at every call.
std::vector<float> StoredNorms(const faiss::IndexFlat& flat) {
  std::vector<float> norms(flat.ntotal);
  faiss::fvec_norms_L2sqr(norms.data(), flat.get_xb(), flat.d, flat.ntotal);
  return norms;
}

// An exact Flat search whose n x ntotal inner products fit this many floats takes them in one
// matrix product and selects each query's k nearest from them. faiss's knn_L2sqr takes one
// product per block of 1024 stored vectors, and OpenBLAS copies (packs) the stored vectors and
// wakes its threads at every call; its result handler then keeps a reservoir per query. For
// subset kNN-MT's sentence selection (58k keys of 256 dims, k 512; embedding included) a batch
// of 16 sentences took ~30 ms in decoding that way, 10-14 ms this way; 64 sentences 50-70 ms,
// 30-35 ms. Larger searches keep faiss's blocks: their products stream the stored vectors
// once, where chunks of queries would re-read them. The products of a search stay allocated to
// its thread (16 MiB at most).
constexpr int64_t kProductFloats = int64_t{4} << 20;  // 16 MiB
// Up to this many queries the products are matrix-vector products, one per query: OpenBLAS's
// matrix product packs the stored vectors first, which for one query against those 58k keys
// took 3.0 ms against 1.5 ms (two queries: 4.5 ms against 3.0 ms).
constexpr int64_t kMatrixVectorQueries = 2;

using Scored = std::pair<float, int64_t>;  // squared distance, id

// At most this many nearest (an IVF coarse search's nprobe, typically) are selected in one pass
// with a bounded heap; more, through a sampled threshold.
constexpr int64_t kMostHeapSelected = 64;

// The `kept` nearest of `distances` (ntotal of them, by distance, ties by id) into the first
// kept entries of `out`, nearest first. REQUIRES: kept <= ntotal.
//
// Few kept: one pass keeps the nearest so far in a max-heap. The ids arrive in increasing order,
// so a distance equal to the farthest kept ranks after it and only a strictly smaller one enters;
// past the first few dozen, nearly every distance is rejected by that one comparison. (It
// replaced the sampled threshold below for IVF coarse searches: ProductL2Search was 1.1% of
// embedded kNN-MT's samples at batch 64, most of it in the selection.)
//
// Many kept: instead of a selection over all distances, a sample (every 4th or more) gives a
// threshold that about twice `kept` distances fall under; the nearest are taken among those, or
// among all when fewer than `kept` fall under it. Every distance at most the threshold is a
// candidate, so the answer is exact either way.
void SelectNearest(const float* distances, int64_t ntotal, int64_t kept, std::vector<Scored>& out) {
  const auto nearer = [](const Scored& a, const Scored& b) {
    return RanksBefore(Metric::kL2, a.first, a.second, b.first, b.second);
  };
  out.clear();
  if (kept <= 0) return;  // an index whose default nprobe is 0
  if (kept <= kMostHeapSelected) {
    for (int64_t j = 0; j < kept; ++j) out.emplace_back(distances[j], j);
    std::make_heap(out.begin(), out.end(), nearer);
    for (int64_t j = kept; j < ntotal; ++j) {
      if (distances[j] < out.front().first) {
        std::pop_heap(out.begin(), out.end(), nearer);
        out.back() = {distances[j], j};
        std::push_heap(out.begin(), out.end(), nearer);
      }
    }
    std::sort_heap(out.begin(), out.end(), nearer);
    return;
  }
  const int64_t samples = std::min<int64_t>(1024, ntotal / 4);
  if (samples >= 64 && kept * 8 <= ntotal) {
    const int64_t stride = ntotal / samples;
    thread_local std::vector<float> sample;
    sample.resize(samples);
    for (int64_t i = 0; i < samples; ++i) sample[i] = distances[i * stride];
    const int64_t rank = std::min(samples - 1, 2 * kept * samples / ntotal + 8);
    std::nth_element(sample.begin(), sample.begin() + rank, sample.end());
    const float threshold = sample[rank];
    for (int64_t j = 0; j < ntotal; ++j) {
      if (distances[j] <= threshold) out.emplace_back(distances[j], j);
    }
  }
  if (static_cast<int64_t>(out.size()) < kept) {
    out.resize(ntotal);
    for (int64_t j = 0; j < ntotal; ++j) out[j] = {distances[j], j};
  }
  std::nth_element(out.begin(), out.begin() + (kept - 1), out.end(), nearer);
  std::sort(out.begin(), out.begin() + kept, nearer);
}

// The k nearest of each of n queries by squared L2 (|x|^2 + |y|^2 - 2<x, y>, clipped at 0, as
// knn_L2sqr computes them), nearest first, ties by id; -1 and +inf past the stored vectors.
// REQUIRES: n * ntotal <= kProductFloats.
void ProductL2Search(const faiss::IndexFlat& flat, const std::vector<float>& norms, const float* x,
                     int64_t n, int64_t k, float* distances, idx_t* labels) {
  const int64_t d = flat.d;
  const int64_t total = flat.ntotal;
  const int64_t kept = std::min(k, total);
  // Kept between calls (fresh megabytes per call cost a page fault per 4 KiB); the calling
  // thread's, hence read through `all` by the OpenMP threads.
  thread_local std::vector<float> products;
  products.resize(n * total);
  float* const all = products.data();
  if (n <= kMatrixVectorQueries) {
    for (int64_t q = 0; q < n; ++q) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(total), static_cast<int>(d), 1.0f,
                  flat.get_xb(), static_cast<int>(d), x + q * d, 1, 0.0f, all + q * total, 1);
    }
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                static_cast<int>(total), static_cast<int>(d), 1.0f, x, static_cast<int>(d),
                flat.get_xb(), static_cast<int>(d), 0.0f, all, static_cast<int>(total));
  }
  ParallelExceptions exceptions;  // rethrown after the region, for Guard to convert
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (int64_t q = 0; q < n; ++q) {
    exceptions.Run([&] {
      float* row = all + q * total;
      const float query_norm = faiss::fvec_norm_L2sqr(x + q * d, d);
      for (int64_t j = 0; j < total; ++j) {
        row[j] = std::max(0.0f, query_norm + norms[j] - 2 * row[j]);
      }
      thread_local std::vector<Scored> nearest;
      SelectNearest(row, total, kept, nearest);
      for (int64_t j = 0; j < k; ++j) {
        distances[q * k + j] = j < kept ? nearest[j].first : std::numeric_limits<float>::infinity();
        labels[q * k + j] = j < kept ? nearest[j].second : -1;
      }
    });
  }
  exceptions.RethrowFirst();
}

// The k nearest of n queries in an exact L2 Flat index by squared L2, as IndexFlat::search
// computes them (knn_L2sqr), given the stored norms: the same answers up to float rounding.
void FlatL2Search(const faiss::IndexFlat& flat, const std::vector<float>& norms, const float* x,
                  int64_t n, int64_t k, float* distances, idx_t* labels) {
  if (flat.ntotal > 0 && n * flat.ntotal <= kProductFloats) {
    ProductL2Search(flat, norms, x, n, k, distances, labels);
  } else {
    faiss::knn_L2sqr(x, flat.get_xb(), flat.d, n, flat.ntotal, k, distances, labels, norms.data());
  }
}

// Takes what IvfAdc needs out of an eligible IVF-PQ index, leaving its lists empty.
IvfPqLists TakeIvfPqLists(faiss::IndexIVFPQ& ivfpq) {
  IvfPqLists lists;
  lists.codebook.m = static_cast<int>(ivfpq.pq.M);
  lists.codebook.dsub = static_cast<int>(ivfpq.pq.dsub);
  lists.codebook.centroids = ivfpq.pq.centroids;
  lists.coarse_centroids.resize(ivfpq.nlist * ivfpq.d);
  ivfpq.quantizer->reconstruct_n(0, ivfpq.nlist, lists.coarse_centroids.data());
  lists.codes.resize(ivfpq.nlist);
  lists.ids.resize(ivfpq.nlist);
  for (size_t l = 0; l < ivfpq.nlist; ++l) {
    TakeList(*ivfpq.invlists, l, lists.codes[l], lists.ids[l]);
  }
  return lists;
}

// Debian's faiss is a generic x86-64 build: for fewer queries than
// distance_compute_blas_threshold (20) its exact distances run a scalar loop (fvec_L2sqr_ref),
// several times slower per query than BLAS. Subset kNN-MT's sentence search (one query per
// source sentence of a batch) and IVF coarse quantizers at small batches sit below that, so BLAS
// is used from one query on. A process-wide faiss setting, made once by the first index.
void PreferBlasDistances() {
  static const bool once = [] {
    faiss::distance_compute_blas_threshold = 1;
    return true;
  }();
  (void)once;
}

}  // namespace

FaissIndex::FaissIndex(std::unique_ptr<faiss::Index> index, int threads)
    : index_(std::move(index)), threads_(threads) {
  PreferBlasDistances();
}

FaissIndex::~FaissIndex() = default;

absl::StatusOr<std::unique_ptr<FaissIndex>> FaissIndex::Create(const std::string& factory, int dim,
                                                               Metric metric, int threads) {
  if (absl::Status s = CheckThreads(threads); !s.ok()) return s;
  if (dim <= 0) return absl::InvalidArgumentError(absl::StrCat("index dimension ", dim));
  std::unique_ptr<faiss::Index> index;
  absl::Status s = Guard(absl::StrCat("index_factory(", dim, ", \"", factory, "\")"), threads, [&] {
    index.reset(faiss::index_factory(dim, factory.c_str(), ToFaiss(metric)));
  });
  if (!s.ok()) return s;
  // index_factory turns on polysemous training for IVFPQ: a simulated-annealing reordering of
  // the codebook that only polysemous (Hamming-filtered) search uses, and which dominates the
  // training time. knnserve never searches in polysemous mode.
  if (auto* ivfpq =
          dynamic_cast<faiss::IndexIVFPQ*>(const_cast<faiss::Index*>(Unwrap(index.get())))) {
    ivfpq->do_polysemous_training = false;
  }
  return std::unique_ptr<FaissIndex>(new FaissIndex(std::move(index), threads));
}

absl::StatusOr<std::unique_ptr<FaissIndex>> FaissIndex::Read(ByteReader& in, int threads) {
  return ReadIndex(in, threads, /*io_flags=*/0);
}

absl::StatusOr<std::unique_ptr<FaissIndex>> FaissIndex::ReadTrainedEmpty(ByteReader& in,
                                                                         int threads) {
  ASSIGN_OR_RETURN(std::unique_ptr<FaissIndex> index,
                   ReadIndex(in, threads, faiss::IO_FLAG_SKIP_PRECOMPUTE_TABLE));
  if (!index->is_trained()) {
    return absl::FailedPreconditionError(absl::StrCat(in.name(), ": the index is not trained"));
  }
  // reset() empties the inverted lists (or the stored vectors) and keeps what training made.
  RETURN_IF_ERROR(Guard(absl::StrCat("reset ", in.name()), 1, [&] { index->index_->reset(); }));
  return index;
}

absl::StatusOr<std::unique_ptr<FaissIndex>> FaissIndex::LoadForServing(ByteReader& in, int threads,
                                                                       AdcKernel kernel) {
  // faiss computes an IVF-PQ index's table of nlist x m x 256 floats while reading it (up to 2
  // GB): IvfAdc never reads it, and PrepareForServing computes it when faiss scans the lists.
  ASSIGN_OR_RETURN(std::unique_ptr<FaissIndex> index,
                   ReadIndex(in, threads, faiss::IO_FLAG_SKIP_PRECOMPUTE_TABLE));
  if (absl::Status s = index->PrepareForServing(kernel); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(in.name(), ": ", s.message()));
  }
  return index;
}

absl::StatusOr<std::unique_ptr<FaissIndex>> FaissIndex::ReadIndex(ByteReader& in, int threads,
                                                                  int io_flags) {
  RETURN_IF_ERROR(CheckThreads(threads));
  ASSIGN_OR_RETURN(std::unique_ptr<faiss::Index> index, ReadFaiss(in, io_flags));
  const faiss::MetricType metric = index->metric_type;
  if (metric != faiss::METRIC_L2 && metric != faiss::METRIC_INNER_PRODUCT) {
    return absl::InvalidArgumentError(absl::StrCat(in.name(), ": faiss index has metric ", metric,
                                                   "; only L2 and inner product are served"));
  }
  return std::unique_ptr<FaissIndex>(new FaissIndex(std::move(index), threads));
}

int FaissIndex::dim() const { return index_->d; }

Metric FaissIndex::metric() const {
  return index_->metric_type == faiss::METRIC_L2 ? Metric::kL2 : Metric::kInnerProduct;
}

int64_t FaissIndex::size() const {
  return ivf_adc_ != nullptr ? ivf_adc_->size() : static_cast<int64_t>(index_->ntotal);
}

bool FaissIndex::is_trained() const { return index_->is_trained; }

absl::Status FaissIndex::Train(MatrixView<const float> sample) {
  RETURN_IF_ERROR(CheckCols(sample, dim(), "training vectors"));
  return Guard(absl::StrCat("train on ", sample.rows, " vectors"), threads_,
               [&] { index_->train(sample.rows, sample.data); });
}

bool FaissIndex::ListsRepacked() const {
  if (ivf_adc_ != nullptr) return true;
  auto* ivf = dynamic_cast<const faiss::IndexIVF*>(Unwrap(index_.get()));
  return ivf != nullptr && dynamic_cast<const CompactInvertedLists*>(ivf->invlists) != nullptr;
}

absl::Status FaissIndex::Add(MatrixView<const float> vectors) {
  RETURN_IF_ERROR(CheckCols(vectors, dim(), "added vectors"));
  // Checked here: faiss would throw from compact lists inside its OpenMP region (IVF-Flat's
  // parallel add), where no Guard can catch it.
  if (ListsRepacked() || !flat_norms_.empty()) {
    return absl::FailedPreconditionError("Add to an index in serving form");
  }
  if (!is_trained()) return absl::FailedPreconditionError("Add before Train");
  return Guard(absl::StrCat("add ", vectors.rows, " vectors"), threads_,
               [&] { index_->add(vectors.rows, vectors.data); });
}

absl::StatusOr<Neighbors> FaissIndex::Search(MatrixView<const float> queries,
                                             const SearchParams& params) const {
  RETURN_IF_ERROR(CheckCols(queries, dim(), "queries"));
  if (params.k <= 0) return absl::InvalidArgumentError(absl::StrCat("k = ", params.k));
  if (ivf_adc_ != nullptr) return SearchWithIvfAdc(queries, params);
  if (!flat_norms_.empty()) return SearchFlatWithNorms(queries, params);
  Neighbors out;
  out.rows = queries.rows;
  out.k = params.k;
  out.distances.resize(queries.rows * params.k);
  std::vector<idx_t> labels(queries.rows * params.k);
  const ParamChain chain(index_.get(), params);
  RETURN_IF_ERROR(Guard("search", threads_, [&] {
    index_->search(queries.rows, queries.data, params.k, out.distances.data(), labels.data(),
                   chain.get());
  }));
  out.ids.assign(labels.begin(), labels.end());
  NormaliseRows(metric(), out);
  return out;
}

// The exact L2 search faiss's IndexFlat::search runs (knn_L2sqr), given the stored norms: the
// same BLAS products and the same norms, hence the same answers.
absl::StatusOr<Neighbors> FaissIndex::SearchFlatWithNorms(MatrixView<const float> queries,
                                                          const SearchParams& params) const {
  const auto* flat = static_cast<const faiss::IndexFlat*>(index_.get());
  Neighbors out;
  out.rows = queries.rows;
  out.k = params.k;
  out.distances.resize(queries.rows * params.k);
  std::vector<idx_t> labels(queries.rows * params.k);
  RETURN_IF_ERROR(Guard("search", threads_, [&] {
    FlatL2Search(*flat, flat_norms_, queries.data, queries.rows, params.k, out.distances.data(),
                 labels.data());
  }));
  out.ids.assign(labels.begin(), labels.end());
  NormaliseRows(metric(), out);
  return out;
}

absl::StatusOr<Neighbors> FaissIndex::SearchWithIvfAdc(MatrixView<const float> queries,
                                                       const SearchParams& params) const {
  const auto* ivf = static_cast<const faiss::IndexIVF*>(Unwrap(index_.get()));
  const auto* pre = dynamic_cast<const faiss::IndexPreTransform*>(index_.get());
  const ParamChain chain(index_.get(), params);
  const int64_t nprobe = std::min<int64_t>(chain.nprobe(), ivf->nlist);
  const int64_t n = queries.rows;
  Matrix<float> transformed;
  MatrixView<const float> x = queries;
  Matrix<float> coarse_distances(n, nprobe);
  Matrix<idx_t> probes(n, nprobe);
  RETURN_IF_ERROR(Guard("coarse search", threads_, [&] {
    if (pre != nullptr) {
      const float* t = pre->apply_chain(n, queries.data);
      if (t != queries.data) {
        transformed = Matrix<float>(n, ivf->d, std::vector<float>(t, t + n * ivf->d));
        delete[] t;
        x = transformed.view();
      }
    }
    if (!coarse_norms_.empty()) {
      FlatL2Search(*ExactL2Flat(ivf->quantizer), coarse_norms_, x.data, n, nprobe,
                   coarse_distances.data(), probes.data());
    } else {
      ivf->quantizer->search(n, x.data, nprobe, coarse_distances.data(), probes.data(),
                             chain.quantizer());
    }
  }));
  return ivf_adc_->Search(x, probes.view(), params.k);
}

absl::StatusOr<FileDigest> FaissIndex::Save(const std::string& path) const {
  if (ListsRepacked()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "save ", path, ": the index is in serving form (lists packed or with 4-byte ids)"));
  }
  return SaveFaiss(index_.get(), path);
}

absl::StatusOr<std::unique_ptr<FaissIndex>> FaissIndex::CloneEmpty() const {
  KNNSERVE_CHECK(is_trained() && size() == 0, "CloneEmpty of an untrained or non-empty index");
  // A write_index/read_index round trip rather than faiss::clone_index: the cloner of faiss
  // 1.7.3 does not know every index type (IVF with an HNSW quantizer), while every type the
  // shards are stored in round-trips by definition.
  faiss::VectorIOWriter writer;
  RETURN_IF_ERROR(
      Guard("serialize trained index", 1, [&] { faiss::write_index(index_.get(), &writer); }));
  SpanReader serialized(writer.data.data(), writer.data.size(), "the trained index");
  ASSIGN_OR_RETURN(std::unique_ptr<faiss::Index> clone, ReadFaiss(serialized));
  return std::unique_ptr<FaissIndex>(new FaissIndex(std::move(clone), threads_));
}

absl::Status FaissIndex::PrepareForServing(AdcKernel kernel) {
  if (const faiss::IndexFlat* flat = ExactL2Flat(index_.get()); flat != nullptr) {
    if (flat->ntotal == 0 || !flat_norms_.empty()) return absl::OkStatus();
    return Guard("flat norms", threads_, [&] { flat_norms_ = StoredNorms(*flat); });
  }
  if (ivf_adc_ != nullptr) return absl::OkStatus();  // prepared already
  faiss::IndexIVFPQ* ivfpq = IvfAdcCandidate(index_.get());
  if (ivfpq == nullptr || !IsQuantized(kernel)) {
    RETURN_IF_ERROR(PrecomputeIvfPqTable());
    return CompactIds();
  }
  if (!CpuSupports(kernel)) {  // checked before the lists are taken out of faiss's index
    return absl::FailedPreconditionError(
        absl::StrCat("this CPU cannot run the ", AdcKernelName(kernel), " kernel"));
  }
  IvfPqLists lists;
  RETURN_IF_ERROR(Guard("take inverted lists", threads_, [&] { lists = TakeIvfPqLists(*ivfpq); }));
  ASSIGN_OR_RETURN(ivf_adc_, IvfAdc::Create(std::move(lists), {threads_, kernel}));
  if (const faiss::IndexFlat* quantizer = ExactL2Flat(ivfpq->quantizer); quantizer != nullptr) {
    RETURN_IF_ERROR(
        Guard("coarse centroid norms", threads_, [&] { coarse_norms_ = StoredNorms(*quantizer); }));
  }
  // faiss's copy of the lists and its precomputed tables (nlist x m x 256 floats) are no longer
  // read: keep empty lists of the same shape.
  return Guard("release inverted lists", threads_, [&] {
    ivfpq->replace_invlists(new faiss::ArrayInvertedLists(ivfpq->nlist, ivfpq->code_size),
                            /*own=*/true);
    ivfpq->precomputed_table.resize(0);
    ivfpq->use_precomputed_table = 0;
  });
}

absl::Status FaissIndex::PrecomputeIvfPqTable() {
  auto* ivfpq = dynamic_cast<faiss::IndexIVFPQ*>(const_cast<faiss::Index*>(Unwrap(index_.get())));
  if (ivfpq == nullptr || !ivfpq->by_residual || ivfpq->precomputed_table.size() > 0) {
    return absl::OkStatus();
  }
  // What read_index does unless told not to (LoadForServing); faiss decides whether to keep it.
  return Guard("precompute IVF-PQ table", threads_, [&] { ivfpq->precompute_table(); });
}

absl::Status FaissIndex::AbsorbIvfLists(std::vector<std::unique_ptr<FaissIndex>> others,
                                        const std::vector<int64_t>& id_offsets) {
  KNNSERVE_CHECK(ivf_adc_ != nullptr, "AbsorbIvfLists without IvfAdc");
  if (others.size() != id_offsets.size()) {
    return absl::InvalidArgumentError(absl::StrCat("AbsorbIvfLists: ", others.size(), " indexes, ",
                                                   id_offsets.size(), " offsets"));
  }
  for (size_t i = 0; i < others.size(); ++i) {
    if (others[i]->ivf_adc_ == nullptr || others[i]->dim() != dim()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "AbsorbIvfLists: index ", i, " is not an IvfAdc index of dimension ", dim()));
    }
  }
  std::vector<std::unique_ptr<IvfAdc>> parts;
  std::vector<int64_t> offsets = {0};
  parts.push_back(std::move(ivf_adc_));
  for (size_t i = 0; i < others.size(); ++i) {
    parts.push_back(std::move(others[i]->ivf_adc_));
    offsets.push_back(id_offsets[i]);
  }
  absl::StatusOr<std::unique_ptr<IvfAdc>> merged = IvfAdc::Merge(&parts, offsets);
  if (!merged.ok()) {  // Merge left the parts untouched: this index keeps its own lists
    ivf_adc_ = std::move(parts[0]);
    return merged.status();
  }
  ivf_adc_ = *std::move(merged);
  return absl::OkStatus();
}

absl::Status FaissIndex::CompactIds() {
  auto* ivf = dynamic_cast<faiss::IndexIVF*>(const_cast<faiss::Index*>(Unwrap(index_.get())));
  if (ivf == nullptr || dynamic_cast<const CompactInvertedLists*>(ivf->invlists)) {
    return absl::OkStatus();
  }
  if (ivf->ntotal >= (int64_t{1} << 32)) {
    return absl::FailedPreconditionError("CompactIds: more than 2^32 vectors in one shard");
  }
  return Guard("compact inverted lists", threads_, [&] {
    ivf->replace_invlists(new CompactInvertedLists(*ivf->invlists), /*own=*/true);
  });
}

double FaissIndex::InvertedListBytesPerVector() const {
  if (ivf_adc_ != nullptr) return ivf_adc_->BytesPerVector();
  auto* ivf = dynamic_cast<const faiss::IndexIVF*>(Unwrap(index_.get()));
  if (ivf == nullptr || ivf->ntotal == 0) return 0;
  const bool compact = dynamic_cast<const CompactInvertedLists*>(ivf->invlists) != nullptr;
  const size_t id_bytes = compact ? sizeof(uint32_t) : sizeof(idx_t);
  return static_cast<double>(ivf->code_size + id_bytes);
}

void FaissIndex::SetOpqIterations(int iterations) {
  auto* pre = dynamic_cast<faiss::IndexPreTransform*>(index_.get());
  if (pre == nullptr) return;
  for (faiss::VectorTransform* t : pre->chain) {
    if (auto* opq = dynamic_cast<faiss::OPQMatrix*>(t)) opq->niter = iterations;
  }
}

FaissIndex::UsedParams FaissIndex::used_params() const {
  // As ParamChain passes them on.
  const faiss::Index* base = Unwrap(index_.get());
  if (auto* ivf = dynamic_cast<const faiss::IndexIVF*>(base)) {
    return {.nprobe = true,
            .ef_search = dynamic_cast<const faiss::IndexHNSW*>(ivf->quantizer) != nullptr};
  }
  return {.nprobe = false, .ef_search = dynamic_cast<const faiss::IndexHNSW*>(base) != nullptr};
}

int FaissIndex::pq_m() const {
  const faiss::Index* base = Unwrap(index_.get());
  if (auto* ivfpq = dynamic_cast<const faiss::IndexIVFPQ*>(base)) return ivfpq->pq.M;
  if (auto* pq = dynamic_cast<const faiss::IndexPQ*>(base)) return pq->pq.M;
  return 0;
}

// --- SubsetQuantizer ---------------------------------------------------------------------------

namespace {

const faiss::IndexPQ* InnerPq(const faiss::Index* index) {
  auto* pre = dynamic_cast<const faiss::IndexPreTransform*>(index);
  return pre == nullptr ? nullptr : dynamic_cast<const faiss::IndexPQ*>(pre->index);
}

}  // namespace

SubsetQuantizer::SubsetQuantizer(std::unique_ptr<faiss::Index> index, int threads)
    : index_(std::move(index)), threads_(threads) {
  const faiss::IndexPQ* pq = InnerPq(index_.get());
  KNNSERVE_CHECK(pq != nullptr, "SubsetQuantizer needs IndexPreTransform(IndexPQ)");
  codebook_.m = static_cast<int>(pq->pq.M);
  codebook_.dsub = static_cast<int>(pq->pq.dsub);
  codebook_.centroids = pq->pq.centroids;
}

SubsetQuantizer::~SubsetQuantizer() = default;

absl::StatusOr<std::unique_ptr<SubsetQuantizer>> SubsetQuantizer::Train(
    const FaissIndex& index, int m, MatrixView<const float> sample, int threads) {
  RETURN_IF_ERROR(CheckThreads(threads));
  RETURN_IF_ERROR(CheckCols(sample, index.dim(), "subset training vectors"));
  const faiss::Index* base = &index.faiss_index();
  auto* pre = dynamic_cast<const faiss::IndexPreTransform*>(base);
  const int dim = pre != nullptr ? pre->index->d : base->d;
  if (m <= 0 || dim % m != 0) {
    return absl::InvalidArgumentError(absl::StrCat("subset PQ: ", m,
                                                   " sub-quantizers do not divide dimension ", dim,
                                                   " (after the index's transform)"));
  }
  if (sample.rows < PqCodebook::kCentroids) {
    return absl::InvalidArgumentError(absl::StrCat("subset PQ needs at least ",
                                                   PqCodebook::kCentroids,
                                                   " training vectors, got ", sample.rows));
  }
  std::unique_ptr<faiss::IndexPreTransform> out;
  RETURN_IF_ERROR(Guard("train subset PQ", threads, [&] {
    out = std::make_unique<faiss::IndexPreTransform>(
        new faiss::IndexPQ(dim, m, 8, base->metric_type));
    out->own_fields = true;
    if (pre != nullptr) {
      faiss::Cloner cloner;
      for (auto it = pre->chain.rbegin(); it != pre->chain.rend(); ++it) {
        out->prepend_transform(cloner.clone_VectorTransform(*it));
      }
    }
    out->train(sample.rows, sample.data);
  }));
  return std::unique_ptr<SubsetQuantizer>(new SubsetQuantizer(std::move(out), threads));
}

absl::StatusOr<std::unique_ptr<SubsetQuantizer>> SubsetQuantizer::Read(ByteReader& in,
                                                                       int threads) {
  RETURN_IF_ERROR(CheckThreads(threads));
  ASSIGN_OR_RETURN(std::unique_ptr<faiss::Index> index, ReadFaiss(in));
  const faiss::IndexPQ* pq = InnerPq(index.get());
  if (pq == nullptr || pq->pq.nbits != 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        in.name(), ": subset quantizer file is not an IndexPreTransform over an 8-bit IndexPQ"));
  }
  return std::unique_ptr<SubsetQuantizer>(new SubsetQuantizer(std::move(index), threads));
}

int SubsetQuantizer::input_dim() const { return index_->d; }

absl::StatusOr<Matrix<float>> SubsetQuantizer::Transform(MatrixView<const float> x) const {
  RETURN_IF_ERROR(CheckCols(x, input_dim(), "vectors"));
  Matrix<float> out(x.rows, codebook_.dim());
  RETURN_IF_ERROR(Guard("apply transform", threads_, [&] {
    auto* pre = static_cast<const faiss::IndexPreTransform*>(index_.get());
    const float* xt = pre->apply_chain(x.rows, x.data);
    std::copy(xt, xt + out.size(), out.data());
    if (xt != x.data) delete[] xt;
  }));
  return out;
}

absl::StatusOr<Matrix<uint8_t>> SubsetQuantizer::Encode(MatrixView<const float> x) const {
  RETURN_IF_ERROR(CheckCols(x, input_dim(), "vectors"));
  Matrix<uint8_t> codes(x.rows, codebook_.m);
  RETURN_IF_ERROR(
      Guard("encode", threads_, [&] { index_->sa_encode(x.rows, x.data, codes.data()); }));
  return codes;
}

absl::StatusOr<FileDigest> SubsetQuantizer::Save(const std::string& path) const {
  return SaveFaiss(index_.get(), path);
}

}  // namespace knnserve
