#include "common/adc/ivf_adc.h"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/adc/two_stage.h"
#include "common/heap.h"
#include "common/omp_threads.h"
#include "common/parallel_exceptions.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

using adc_internal::Candidate;
using adc_internal::CandidateFilter;
using adc_internal::LutQuantization;
using adc_internal::PackedLine;

constexpr int kLutSize = PqCodebook::kCentroids;
// Rows whose query tables are built in one pass over the centroids (SetUpRows).
constexpr int kTableRows = 8;
// Rows pre-scanned in one pass over a list's codes: the quantized kernels' most queries.
constexpr int kPassRows = 8;
// The float tables of the rows searched together (SearchRows) take at most this much, and at
// least kTableRows rows, at most kMostRowsTogether, are searched together.
constexpr size_t kRowsTogetherLutBytes = size_t{8} << 20;
constexpr int kMostRowsTogether = 256;
constexpr double kNoBound = std::numeric_limits<double>::infinity();

absl::Status CheckLists(const IvfPqLists& lists) {
  const PqCodebook& pq = lists.codebook;
  if (pq.m < 1 || pq.m > kMaxAdcM || pq.dsub < 1 ||
      pq.centroids.size() != static_cast<size_t>(pq.m) * kLutSize * pq.dsub) {
    return absl::InvalidArgumentError(absl::StrCat("IVF-PQ codebook: m = ", pq.m,
                                                   ", dsub = ", pq.dsub, ", ", pq.centroids.size(),
                                                   " centroid floats"));
  }
  if (lists.codes.size() != lists.ids.size() ||
      lists.coarse_centroids.size() != lists.ids.size() * pq.dim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IVF-PQ lists: ", lists.codes.size(), " code lists, ", lists.ids.size(), " id lists, ",
        lists.coarse_centroids.size(), " coarse centroid floats (dimension ", pq.dim(), ")"));
  }
  for (int l = 0; l < lists.nlist(); ++l) {
    if (lists.codes[l].size() != lists.ids[l].size() * pq.m) {
      return absl::InvalidArgumentError(absl::StrCat("IVF-PQ list ", l, ": ", lists.codes[l].size(),
                                                     " code bytes for ", lists.ids[l].size(),
                                                     " vectors"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// A survivor of the pre-scan awaiting its exact distance: the lower bound of its distance, and
// what that distance needs, copied while its list is scanned (and cached): by the time a row's
// survivors are re-ranked, the other rows' lists have been scanned too.
struct IvfAdc::Pending {
  double lower;
  float bias;  // its b
  // Its place in its list. Its local id is read only when it is costed: the scan reads no ids,
  // so loading one per survivor missed the caches (over half of DeferSurvivors' samples on
  // replayed dev-set queries); DeferSurvivors prefetches the id's line instead.
  uint32_t position;
  uint32_t code;  // its code's m bytes at Row::codes[code * m] (the row's code-th survivor)
  int probe;      // of its list
};

// One row's tables and search state.
struct IvfAdc::Row {
  const float* query = nullptr;
  const float* lut = nullptr;      // T: m x 256 floats
  const uint8_t* table = nullptr;  // T quantized as query_bounds
  LutQuantization query_bounds;
  double query_norm = 0.0;          // ||q||
  const int64_t* probes = nullptr;  // nprobe lists, nearest first (−1: none)
  std::vector<float> x_norms;       // per probe: ||x||², x = q − c_l
  std::vector<Pending> pending;
  std::vector<uint8_t> codes;  // of the pending survivors
  // Max-heap of the k smallest upper bounds of distances offered; kth_bound its top (infinite
  // until k are known), an upper bound of the row's k-th distance.
  std::vector<double> upper_bounds;
  double kth_bound = kNoBound;
  std::vector<Candidate> heap;  // the k nearest by exact distance
};

// Probe `probe` of row `row` (in Scratch::rows) is list `list`.
struct IvfAdc::ListVisit {
  int64_t list;
  int row;
  int probe;
};

// Per thread, kept between calls (tables of tens of KiB per row otherwise reallocated).
struct IvfAdc::Scratch {
  adc_internal::AlignedVector<float> luts;      // per row of SearchRows: m x 256 floats, T
  adc_internal::AlignedVector<uint8_t> tables;  // and quantized
  std::vector<Row> rows;
  std::vector<ListVisit> visits;
  // Per row of a pass over a list: its vectors' b in the row's table steps, and its filter.
  adc_internal::AlignedVector<uint16_t> biases[kPassRows];
  CandidateFilter filters[kPassRows];
};

absl::StatusOr<std::unique_ptr<IvfAdc>> IvfAdc::Create(IvfPqLists lists, Options options) {
  RETURN_IF_ERROR(CheckLists(lists));
  if (options.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads = ", options.threads));
  }
  if (!IsQuantized(options.kernel) || !CpuSupports(options.kernel)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "IVF ADC needs a quantized kernel this CPU runs, not ", AdcKernelName(options.kernel)));
  }
  std::unique_ptr<IvfAdc> adc(
      new IvfAdc(std::move(lists.codebook), std::move(lists.coarse_centroids), options));
  const int m = adc->codebook_.m;
  adc->block_begin_ = {0};
  adc->list_begin_ = {0};
  for (int l = 0; l < lists.nlist(); ++l) {
    const int64_t n = static_cast<int64_t>(lists.ids[l].size());
    adc->block_begin_.push_back(adc->block_begin_.back() + (n + kAdcBlock - 1) / kAdcBlock);
    adc->list_begin_.push_back(adc->list_begin_.back() + n);
  }
  // Reserved, then grown block by block as the lists are packed and freed: resizing at once
  // would zero (and so make resident) every packed page while all lists are still held.
  adc->lines_.reserve(adc->block_begin_.back() * m);
  adc->ids_.reserve(adc->list_begin_.back());
  adc->ComputeBiases(lists.codes);
  // Lanes past a list's end read code 0 and are masked out by the scan.
  const std::vector<uint8_t> zero_row(m, 0);
  const uint8_t* rows[kAdcBlock];
  constexpr size_t kTrimBytes = size_t{64} << 20;
  size_t freed_bytes = 0;
  for (int l = 0; l < lists.nlist(); ++l) {
    const std::vector<uint8_t>& codes = lists.codes[l];
    const int64_t n = static_cast<int64_t>(lists.ids[l].size());
    for (int64_t b = 0; b < n; b += kAdcBlock) {
      for (int i = 0; i < kAdcBlock; ++i) {
        rows[i] = b + i < n ? codes.data() + (b + i) * m : zero_row.data();
      }
      adc->lines_.resize(adc->lines_.size() + m);
      adc->kernels_.pack(rows, m, adc->lines_[adc->lines_.size() - m].bytes);
    }
    adc->ids_.insert(adc->ids_.end(), lists.ids[l].begin(), lists.ids[l].end());
    // Keeps the peak near one copy of the codes: the packed lines are mapped apart, so the lists
    // freed on the heap must be returned to the system as the packed ones grow.
    freed_bytes += lists.codes[l].capacity() + lists.ids[l].capacity() * sizeof(uint32_t);
    FreeVector(lists.codes[l]);
    FreeVector(lists.ids[l]);
    if (freed_bytes >= kTrimBytes) {
      ReturnFreedHeapMemory();
      freed_bytes = 0;
    }
  }
  return adc;
}

absl::StatusOr<std::unique_ptr<IvfAdc>> IvfAdc::Merge(
    std::vector<std::unique_ptr<IvfAdc>>* parts_in, const std::vector<int64_t>& id_offsets) {
  std::vector<std::unique_ptr<IvfAdc>>& parts = *parts_in;
  if (parts.empty() || parts.size() != id_offsets.size()) {
    return absl::InvalidArgumentError(absl::StrCat("IVF ADC merge of ", parts.size(),
                                                   " parts with ", id_offsets.size(), " offsets"));
  }
  const Options options = parts[0]->options_;
  IvfPqLists lists;
  lists.codebook = parts[0]->codebook_;
  lists.coarse_centroids = parts[0]->coarse_centroids_;
  const int nlist = static_cast<int>(parts[0]->list_begin_.size()) - 1;
  const int m = lists.codebook.m;
  lists.codes.resize(nlist);
  lists.ids.resize(nlist);
  for (size_t i = 0; i < parts.size(); ++i) {  // all checks before any part is consumed
    const IvfAdc& part = *parts[i];
    if (part.codebook_.centroids != lists.codebook.centroids ||
        part.coarse_centroids_ != lists.coarse_centroids) {
      return absl::FailedPreconditionError(absl::StrCat(
          "IVF ADC merge: part ", i, " has other coarse centroids or PQ codebook than part 0"));
    }
    if (id_offsets[i] < 0 || id_offsets[i] + part.size() > (int64_t{1} << 32)) {
      return absl::InvalidArgumentError(absl::StrCat("IVF ADC merge: part ", i, " at id offset ",
                                                     id_offsets[i], " exceeds 32-bit ids"));
    }
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    const IvfAdc& part = *parts[i];
    for (int l = 0; l < nlist; ++l) {
      const PackedLine* blocks = part.lines_.data() + part.block_begin_[l] * m;
      for (int64_t v = part.list_begin_[l]; v < part.list_begin_[l + 1]; ++v) {
        const int64_t position = v - part.list_begin_[l];
        const size_t at = lists.codes[l].size();
        lists.codes[l].resize(at + m);
        adc_internal::CopyLaneCode(blocks + position / kAdcBlock * m, m,
                                   static_cast<int>(position % kAdcBlock), &lists.codes[l][at]);
        lists.ids[l].push_back(static_cast<uint32_t>(part.ids_[v] + id_offsets[i]));
      }
    }
    parts[i].reset();  // its packed lists are copied: free them before packing the merged ones
  }
  return Create(std::move(lists), options);
}

IvfAdc::IvfAdc(PqCodebook codebook, std::vector<float> coarse_centroids, Options options)
    : codebook_(std::move(codebook)),
      coarse_centroids_(std::move(coarse_centroids)),
      options_(options),
      kernels_(GetQuantizedKernels(options.kernel)),
      tables_(BestAdcTableKernels()),
      centroids_t_(adc_internal::TransposeCentroids(codebook_)),
      norms_(static_cast<size_t>(codebook_.m) * kLutSize),
      zeros_(static_cast<size_t>(codebook_.m) * kLutSize, 0.0f) {
  double largest_sum = 0.0;
  for (int m = 0; m < codebook_.m; ++m) {
    float largest = 0.0f;
    for (int c = 0; c < kLutSize; ++c) {
      const size_t i = static_cast<size_t>(m) * kLutSize + c;
      const float* r = codebook_.centroids.data() + i * codebook_.dsub;
      float norm = 0.0f;
      for (int j = 0; j < codebook_.dsub; ++j) norm += r[j] * r[j];
      norms_[i] = norm;
      largest = std::max(largest, norm);
    }
    largest_sum += largest;
  }
  norms_max_sum_ = static_cast<float>(largest_sum);
  centroid_bound_ = static_cast<float>(std::sqrt(largest_sum));
}

// b = Σ_m (||r_m||² + 2⟨c_l,m, r_m⟩) in double, from a per-list table of its m x 256 terms,
// kept as a float: the exact distance's own term.
void IvfAdc::ComputeBiases(const std::vector<std::vector<uint8_t>>& codes) {
  const int m = codebook_.m, dsub = codebook_.dsub, d = dim();
  biases_.reserve(list_begin_.back());
  std::vector<double> terms(static_cast<size_t>(m) * kLutSize);
  for (size_t l = 0; l < codes.size(); ++l) {
    const int64_t n = static_cast<int64_t>(codes[l].size()) / m;
    const float* centroid = coarse_centroids_.data() + l * d;
    if (n > 0) {
      for (int i = 0; i < m * kLutSize; ++i) {
        const float* r = codebook_.centroids.data() + static_cast<size_t>(i) * dsub;
        double dot = 0.0;
        for (int j = 0; j < dsub; ++j)
          dot += static_cast<double>(centroid[i / kLutSize * dsub + j]) * r[j];
        terms[i] = norms_[i] + 2.0 * dot;
      }
    }
    float low = std::numeric_limits<float>::infinity();
    float high = -low;
    for (int64_t v = 0; v < n; ++v) {
      const uint8_t* code = codes[l].data() + v * m;
      double sum = 0.0;
      for (int s = 0; s < m; ++s) sum += terms[s * kLutSize + code[s]];
      const float bias = static_cast<float>(sum);
      biases_.push_back(bias);
      low = std::min(low, bias);
      high = std::max(high, bias);
    }
    bias_min_.push_back(n > 0 ? low : 0.0f);
    bias_max_.push_back(n > 0 ? high : 0.0f);
  }
}

IvfAdc::~IvfAdc() = default;

double IvfAdc::BytesPerVector() const {
  if (ids_.empty()) return 0;
  return static_cast<double>(lines_.size() * sizeof(PackedLine) + ids_.size() * sizeof(uint32_t) +
                             biases_.size() * sizeof(float)) /
         static_cast<double>(ids_.size());
}

absl::StatusOr<Neighbors> IvfAdc::Search(MatrixView<const float> queries,
                                         MatrixView<const int64_t> probes, int k) const {
  if (queries.cols != dim() || probes.rows != queries.rows || k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("IVF ADC search: queries ", queries.rows, " x ", queries.cols, " (dimension ",
                     dim(), "), probes ", probes.rows, " x ", probes.cols, ", k = ", k));
  }
  for (int64_t i = 0; i < probes.rows * probes.cols; ++i) {
    const int64_t list = probes.data[i];
    if (list < -1 || list >= static_cast<int64_t>(block_begin_.size()) - 1) {
      return absl::InvalidArgumentError(absl::StrCat("IVF ADC search: probe of list ", list));
    }
  }
  Neighbors out = Neighbors::Missing(queries.rows, k, Metric::kL2, /*with_values=*/false);
  const ScopedOmpThreads scoped_threads(options_.threads);
  const size_t lut_bytes = static_cast<size_t>(codebook_.m) * kLutSize * sizeof(float);
  const int together = static_cast<int>(
      std::clamp<size_t>(kRowsTogetherLutBytes / lut_bytes, kTableRows, kMostRowsTogether));
  ParallelExceptions exceptions;
#pragma omp parallel if (queries.rows > 1)
  {
    thread_local Scratch scratch;
    // Contiguous rows per thread: a beam's hypotheses are adjacent rows that probe mostly the
    // same lists.
    const int threads = omp_get_num_threads();
    const int thread = omp_get_thread_num();
    exceptions.Run([&] {
      const int64_t end = queries.rows * (thread + 1) / threads;
      for (int64_t first = queries.rows * thread / threads; first < end; first += together) {
        const int num = static_cast<int>(std::min<int64_t>(together, end - first));
        SearchRows(queries, probes, first, num, k, scratch, out);
      }
    });
  }
  RETURN_IF_ERROR(exceptions.ToStatus("IVF ADC search"));
  return out;
}

// The table kernel keeps each sub-quantizer's centroids (dsub x 256 floats) in L1 while it
// builds that part of every query's table: the centroids (512 KiB at d 512) are read once per
// kTableRows rows instead of once per row. Read per row they came from L2 or beyond and were 5%
// of a quarter-size shard's time (service_bench b); the tables are the same either way. Each
// table is quantized while it is still cached.
void IvfAdc::SetUpRows(MatrixView<const float> queries, MatrixView<const int64_t> probes,
                       int64_t first, int num, Scratch& scratch) const {
  const int m = codebook_.m;
  const int d = dim();
  const size_t table_size = static_cast<size_t>(m) * kLutSize;
  scratch.luts.resize(num * table_size);
  scratch.tables.resize(num * table_size);
  if (static_cast<int>(scratch.rows.size()) < num) scratch.rows.resize(num);
  for (int group = 0; group < num; group += kTableRows) {
    const int count = std::min(kTableRows, num - group);
    const float* xs[kTableRows];
    float* luts[kTableRows];
    for (int i = 0; i < count; ++i) {
      xs[i] = queries.row(first + group + i);
      luts[i] = scratch.luts.data() + (group + i) * table_size;
    }
    tables_.residual_luts(xs, count, centroids_t_.data(), zeros_.data(), m, codebook_.dsub, luts);
    for (int i = 0; i < count; ++i) {
      Row& row = scratch.rows[group + i];
      uint8_t* table = scratch.tables.data() + (group + i) * table_size;
      row.query = xs[i];
      row.lut = luts[i];
      row.query_bounds = adc_internal::QuantizeLut(row.lut, m, Metric::kL2, table);
      row.table = table;
      double norm = 0.0;
      for (int j = 0; j < d; ++j) norm += static_cast<double>(row.query[j]) * row.query[j];
      row.query_norm = std::sqrt(norm);
      row.probes = probes.row(first + group + i);
      row.x_norms.assign(probes.cols, 0.0f);
      for (int p = 0; p < probes.cols; ++p) {
        const int64_t list = row.probes[p];
        if (list < 0 || list_begin_[list] == list_begin_[list + 1]) continue;
        row.x_norms[p] = adc_internal::SquaredL2(row.query, coarse_centroids_.data() + list * d, d);
      }
      row.pending.clear();
      row.codes.clear();
      row.upper_bounds.clear();
      row.kth_bound = kNoBound;
      row.heap.clear();
    }
  }
}

// A decoding step's rows probe the same lists many times over: the demo's kNN-MT at batch 64
// (171 rows, nprobe 8, 1,024 lists) probed 320 distinct lists per call for 1,268 probes, and
// its beams alone shared a third of theirs. Each list is scanned once for all rows that probe
// it, up to kPassRows per pass, so its codes are read once instead of once per row. Each row's
// nearest list comes first, for all rows: on clustered keys it holds most of the k nearest, and
// its exact k-th distance caps the row's other lists far tighter than upper bounds do; then the
// other lists, in list order. The order changes what is pruned, never the answer. A list a row
// names twice is scanned once for it: a vector offered twice would count twice among the k
// smallest upper bounds and could prune a true neighbour.
void IvfAdc::SearchRows(MatrixView<const float> queries, MatrixView<const int64_t> probes,
                        int64_t first, int num, int k, Scratch& scratch, Neighbors& out) const {
  SetUpRows(queries, probes, first, num, scratch);
  std::vector<ListVisit>& visits = scratch.visits;
  for (const bool nearest : {true, false}) {
    visits.clear();
    for (int i = 0; i < num; ++i) {
      const int64_t* row_probes = scratch.rows[i].probes;
      int64_t first_list = -1;
      for (int p = 0; p < probes.cols; ++p) {
        const int64_t list = row_probes[p];
        if (list < 0 || list_begin_[list] == list_begin_[list + 1]) continue;
        if (first_list < 0) {
          first_list = list;
          if (nearest) visits.push_back({list, i, p});
        } else if (!nearest && list != first_list) {
          visits.push_back({list, i, p});
        }
      }
    }
    std::sort(visits.begin(), visits.end(), [](const ListVisit& a, const ListVisit& b) {
      return a.list != b.list ? a.list < b.list : a.row < b.row;
    });
    visits.erase(std::unique(visits.begin(), visits.end(),
                             [](const ListVisit& a, const ListVisit& b) {
                               return a.list == b.list && a.row == b.row;
                             }),
                 visits.end());
    for (size_t a = 0, b = 0; a < visits.size(); a = b) {
      while (b < visits.size() && visits[b].list == visits[a].list) ++b;
      // The next list's biases arrive while this one is scanned: BiasSteps, a loop over them,
      // waited on their first loads (its samples halved with this, on replayed dev-set keys).
      if (b < visits.size()) PrefetchBiases(visits[b].list);
      ScanList(visits[a].list, visits.data() + a, static_cast<int>(b - a), k, scratch);
    }
  }
  const size_t lut_bytes = static_cast<size_t>(codebook_.m) * kLutSize * sizeof(float);
  for (int i = 0; i < num; ++i) {
    Row& row = scratch.rows[i];
    // The next row's table, out of the caches since its lists were scanned, is fetched while this
    // row's survivors are costed.
    if (i + 1 < num) {
      const char* next = reinterpret_cast<const char*>(scratch.rows[i + 1].lut);
      for (size_t b = 0; b < lut_bytes; b += 64) __builtin_prefetch(next + b, 0, 2);
    }
    RerankPending(k, row);
    adc_internal::WriteNearestFirst(Metric::kL2, row.heap, first + i, k, out);
  }
}

namespace {

// Widens a distance bound x_norm + cost for the float rounding of that sum (and of the bound's
// own arithmetic) by a wide factor.
double Rounding(double cost, float x_norm) { return 4.0 * FLT_EPSILON * (std::abs(cost) + x_norm); }

// The largest integer sum worth keeping in a list whose distances are x_norm + cost (cost
// bounded by `bounds`), when k vectors at distances <= `kth_bound` are known: no limit while
// kth_bound is infinite; −1 when nothing in the list can rank before them.
int64_t SumCap(double kth_bound, const LutQuantization& bounds, float x_norm) {
  if (kth_bound == kNoBound || bounds.keeps_all()) return LutQuantization::kKeepAll;
  return bounds.LargestSumWithin(kth_bound - x_norm + Rounding(kth_bound, x_norm));
}

}  // namespace

// A max-heap of the k smallest upper bounds offered; its top is the bound. Replacing the top
// sifts the new bound down in one pass (pop_heap + push_heap take two).
void IvfAdc::OfferUpperBound(double upper, int k, Row& row) const {
  if (upper >= row.kth_bound) return;
  std::vector<double>& heap = row.upper_bounds;
  if (static_cast<int>(heap.size()) < k) {
    heap.push_back(upper);
    std::push_heap(heap.begin(), heap.end());
    if (static_cast<int>(heap.size()) == k) row.kth_bound = heap.front();
    return;
  }
  size_t at = 0;
  for (size_t child = 1; child < heap.size(); child = 2 * at + 1) {
    if (child + 1 < heap.size() && heap[child + 1] > heap[child]) ++child;
    if (heap[child] <= upper) break;
    heap[at] = heap[child];
    at = child;
  }
  heap[at] = upper;
  row.kth_bound = heap.front();
}

double IvfAdc::KthBound(int k, const Row& row) const {
  if (static_cast<int>(row.heap.size()) < k) return row.kth_bound;
  return std::min<double>(row.kth_bound, row.heap.front().first);
}

// Survivors are kept with the bounds of their distances; the k smallest upper bounds so far (and
// the k-th exact distance, once known) cap the integer sums worth keeping in the next lists.
// Until k exact distances are known a list's survivors are re-ranked at once; after that they
// wait until every probed list is scanned, and are re-ranked nearest lower bound first until the
// k-th exact distance found is below the next lower bound. Re-ranking every list's survivors as
// it was scanned (the previous form) costed every vector that ranked among the first k of the
// lists seen so far: about k (1 + ln nprobe) per row instead of k plus those whose bounds
// straddle the k-th distance.
void IvfAdc::ScanList(int64_t list, const ListVisit* visits, int count, int k,
                      Scratch& scratch) const {
  const int m = codebook_.m;
  const int64_t n = list_begin_[list + 1] - list_begin_[list];
  struct Scanned {
    Row* row;
    int probe;
    LutQuantization bounds;
  };
  Scanned pass[kPassRows];
  int num = 0;
  const auto scan_pass = [&] {
    const uint8_t* tables[kPassRows];
    const uint16_t* biases[kPassRows];
    for (int i = 0; i < num; ++i) {
      tables[i] = pass[i].row->table;
      biases[i] = scratch.biases[i].data();
    }
    adc_internal::FilterPackedBlocks(kernels_, tables, num, lines_.data() + block_begin_[list] * m,
                                     n, m, biases, scratch.filters);
    for (int i = 0; i < num; ++i) {
      Row& row = *pass[i].row;
      DeferSurvivors(pass[i].probe, list, pass[i].bounds, k, scratch.filters[i], row);
      // Until k exact distances are known, a list's survivors are re-ranked at once: their exact
      // k-th distance caps the next lists far tighter than upper bounds do.
      if (static_cast<int>(row.heap.size()) < k) RerankPending(k, row);
    }
    num = 0;
  };
  for (int v = 0; v < count; ++v) {
    Row& row = scratch.rows[visits[v].row];
    const int probe = visits[v].probe;
    const float x_norm = row.x_norms[probe];
    LutQuantization bounds;
    if (row.query_bounds.keeps_all() ||
        !ListBounds(list, x_norm, row.query_norm, row.query_bounds, &bounds)) {
      CostWholeList(list, x_norm, k, row);
      continue;
    }
    const int64_t cap = SumCap(KthBound(k, row), bounds, x_norm);
    if (cap < 0) continue;  // nothing in this list can rank before the k bounded
    BiasSteps(list, bounds.step, scratch.biases[num]);
    // Once k distances are bounded, the cap is rarely beaten by the list's own k-th sum (a list
    // holds a fraction of the probed vectors), and keeping that sum costs a heap operation per
    // vector under the cap; DeferSurvivors still drops those the bound, lowered by the list's
    // own survivors, excludes.
    const bool capped = cap < LutQuantization::kKeepAll;
    scratch.filters[num].Reset(capped ? 0 : k, bounds.margin, static_cast<uint16_t>(cap));
    pass[num++] = {&row, probe, bounds};
    if (num == kPassRows) scan_pass();
  }
  if (num > 0) scan_pass();
}

float IvfAdc::Distance(float x_norm, float bias, const uint8_t* code, const float* lut) const {
  float cost;
  adc_internal::ScanScalar(&lut, 1, code, 1, codebook_.m, &cost);
  return x_norm + (bias + cost);
}

// The pre-scan sum of a vector is Q = Q_T + B: Q_T its query-table sum, B = floor((b − min) /
// step) its bias in table steps (min the list's smallest b). Its exact cost (distance − ||x||²)
// is b + Σ T up to float rounding, so with the table's window [base + step (Q_T − slack),
// base + step (Q_T + m + slack)) and b within [min + step (B − 1), min + step (B + 2)), the cost
// lies within [base' + step (Q − slack'), base' + step (Q + upper)), base' = base + min,
// slack' = slack + extra, upper = m + slack + extra, where `extra` steps cover the rounding of
// T's entries and sums, of the exact sum, of x and of base' (bounded from the magnitudes by
// Cauchy-Schwarz, with a wide factor) plus the biases' flooring; the filter's margin is the
// window's width, upper + slack'.
bool IvfAdc::ListBounds(int64_t list, float x_norm, double query_norm,
                        const LutQuantization& query_bounds, LutQuantization* bounds) const {
  const int m = codebook_.m;
  const double step = query_bounds.step;
  const float bias_min = bias_min_[list];
  const double bias_max = bias_max_[list];
  const double magnitude = 2.0 * (query_norm + std::sqrt(x_norm)) * centroid_bound_ +
                           norms_max_sum_ + std::abs(bias_min) + std::abs(bias_max) + x_norm +
                           std::abs(query_bounds.base);
  const double rounding = 16.0 * (m + codebook_.dsub + 4) * FLT_EPSILON * magnitude / step;
  const double extra = std::ceil(rounding) + 2.0;
  const double slack = query_bounds.slack + extra;
  const double upper = m + query_bounds.slack + extra;
  // Every sum must fit 16 bits unsaturated, with room for the filter's margin.
  if (255.0 * m + (bias_max - bias_min) / step + 2.0 + upper + slack >= LutQuantization::kKeepAll) {
    return false;
  }
  bounds->base = static_cast<float>(query_bounds.base + bias_min);
  bounds->step = query_bounds.step;
  bounds->slack = static_cast<int>(slack);
  bounds->margin = static_cast<int>(upper + slack);
  return true;
}

void IvfAdc::PrefetchBiases(int64_t list) const {
  const char* begin = reinterpret_cast<const char*>(biases_.data() + list_begin_[list]);
  const char* end = reinterpret_cast<const char*>(biases_.data() + list_begin_[list + 1]);
  for (const char* p = begin; p < end; p += 64) __builtin_prefetch(p, 0, 3);
}

void IvfAdc::BiasSteps(int64_t list, double step,
                       adc_internal::AlignedVector<uint16_t>& out) const {
  const int64_t first = list_begin_[list];
  const int64_t n = list_begin_[list + 1] - first;
  const float bias_min = bias_min_[list];
  // Every position is written once: the list's biases, then zeros up to a whole block.
  const int64_t padded = (n + kAdcBlock - 1) / kAdcBlock * kAdcBlock;
  if (static_cast<int64_t>(out.size()) < padded) out.resize(padded);
  const float inverse_step = static_cast<float>(1.0 / step);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<uint16_t>((biases_[first + i] - bias_min) * inverse_step);
  }
  std::fill(out.begin() + n, out.begin() + padded, uint16_t{0});
}

// A survivor of sum Q costs within [base + step (Q − slack), base + step (Q − slack + margin)).
void IvfAdc::DeferSurvivors(int probe, int64_t list, const LutQuantization& bounds, int k,
                            CandidateFilter& filter, Row& row) const {
  const int m = codebook_.m;
  const PackedLine* blocks = lines_.data() + block_begin_[list] * m;
  const uint32_t* ids = ids_.data() + list_begin_[list];
  const float* biases = biases_.data() + list_begin_[list];
  const float x_norm = row.x_norms[probe];
  for (const auto& [sum, position] : filter.Survivors()) {
    const double low_cost = bounds.base + static_cast<double>(bounds.step) * (sum - bounds.slack);
    const double lower = x_norm + low_cost - Rounding(low_cost, x_norm);
    if (lower > KthBound(k, row)) continue;
    const double high_cost = low_cost + static_cast<double>(bounds.step) * bounds.margin;
    const size_t at = row.codes.size();
    row.codes.resize(at + m);
    adc_internal::CopyLaneCode(blocks + position / kAdcBlock * m, m,
                               static_cast<int>(position % kAdcBlock), row.codes.data() + at);
    __builtin_prefetch(ids + position);
    // Every pending survivor has its code in row.codes, in order (both are cleared together).
    row.pending.push_back({lower, biases[position], static_cast<uint32_t>(position),
                           static_cast<uint32_t>(row.pending.size()), probe});
    OfferUpperBound(x_norm + high_cost + Rounding(high_cost, x_norm), k, row);
  }
}

// Rare: a list whose biases span more than 16-bit sums can hold next to the table's (or a
// degenerate table). Every vector is costed: the same distances as any other list's.
void IvfAdc::CostWholeList(int64_t list, float x_norm, int k, Row& row) const {
  const int m = codebook_.m;
  const PackedLine* blocks = lines_.data() + block_begin_[list] * m;
  const uint32_t* ids = ids_.data() + list_begin_[list];
  const float* biases = biases_.data() + list_begin_[list];
  const int64_t n = list_begin_[list + 1] - list_begin_[list];
  uint8_t code[kMaxAdcM];
  for (int64_t i = 0; i < n; ++i) {
    adc_internal::CopyLaneCode(blocks + i / kAdcBlock * m, m, static_cast<int>(i % kAdcBlock),
                               code);
    const float distance = Distance(x_norm, biases[i], code, row.lut);
    OfferExact(ids[i], distance, k, row);
    OfferUpperBound(distance, k, row);
  }
}

void IvfAdc::OfferExact(uint32_t id, float distance, int k, Row& row) const {
  adc_internal::OfferBounded(Metric::kL2, k, {distance, id}, row.heap);
}

// A survivor's exact distance is m look-ups in the query's float table T plus its list's ||x||²
// and its own b. The residual form (m x dsub fused multiply-adds per survivor, or a residual
// table per list with many survivors) took 16% of a shard's time in the demo's kNN-MT searches.
namespace {
void PrefetchLookups(const uint8_t* code, int m, const float* lut) {
  for (int j = 0; j < m; ++j) __builtin_prefetch(lut + j * 256 + code[j], 0, 3);
}
}  // namespace

void IvfAdc::RerankPending(int k, Row& row) const {
  std::vector<Pending>& pending = row.pending;
  const double kth_bound = KthBound(k, row);
  pending.erase(std::remove_if(pending.begin(), pending.end(),
                               [kth_bound](const Pending& c) { return c.lower > kth_bound; }),
                pending.end());
  std::sort(pending.begin(), pending.end(),
            [](const Pending& a, const Pending& b) { return a.lower < b.lower; });
  const int m = codebook_.m;
  const auto code_of = [&](const Pending& c) {
    return row.codes.data() + static_cast<size_t>(c.code) * m;
  };
  const auto id_of = [&](const Pending& c) {
    return ids_.data() + list_begin_[row.probes[c.probe]] + c.position;
  };
  for (size_t i = 0; i < pending.size(); ++i) {
    const Pending& c = pending[i];
    if (static_cast<int>(row.heap.size()) >= k && c.lower > row.heap.front().first) {
      break;  // its distance and every later one exceed the k-th found
    }
    if (i + 1 < pending.size()) {
      PrefetchLookups(code_of(pending[i + 1]), m, row.lut);
      __builtin_prefetch(id_of(pending[i + 1]));
    }
    OfferExact(*id_of(c), Distance(row.x_norms[c.probe], c.bias, code_of(c), row.lut), k, row);
  }
  pending.clear();  // those left rank after the k found, which only get nearer
  row.codes.clear();
}

}  // namespace knnserve
