#include "common/adc/ivf_adc.h"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/adc/two_stage.h"
#include "common/omp_threads.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

using adc_internal::Candidate;
using adc_internal::CandidateFilter;
using adc_internal::LutQuantization;
using adc_internal::PackedLine;

constexpr int kLutSize = PqCodebook::kCentroids;

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

// A survivor of the pre-scan awaiting its exact distance: probe p's list, position in it, and
// the lower bound of its distance.
struct IvfAdc::Pending {
  double lower;
  int64_t position;  // −1 once costed through its list's table
  int probe;
  uint32_t id;  // local id, read while the list is scanned: in list order, not ranked order
};

struct IvfAdc::Scratch {
  std::vector<float> residuals;                      // nprobe x dim: x = q − c_l per probe
  std::vector<float> x_norms;                        // nprobe: ||x||²
  adc_internal::AlignedVector<float> query_lut;      // m x 256: T of the query
  adc_internal::AlignedVector<uint8_t> query_table;  // and quantized
  adc_internal::AlignedVector<uint16_t> biases;  // per position of the list: its b in table steps
  adc_internal::AlignedVector<float> residual_lut;  // m x 256: the residual table of x (fallback)
  adc_internal::AlignedVector<uint8_t> residual_table;
  CandidateFilter filter;
  uint8_t code[kMaxAdcM];
  std::vector<Pending> pending;
  std::vector<int> pending_per_probe;
  // Max-heap of the k smallest upper bounds of distances offered; kth_bound its top (infinite
  // until k are known), an upper bound of the row's k-th distance.
  std::vector<double> upper_bounds;
  double kth_bound = std::numeric_limits<double>::infinity();
  std::vector<Candidate> heap;  // the k nearest by exact distance
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
  adc->lines_.resize(adc->block_begin_.back() * m);
  adc->ids_.reserve(adc->list_begin_.back());
  adc->ComputeBiases(lists.codes);
  // Lanes past a list's end read code 0 and are masked out by the scan.
  const std::vector<uint8_t> zero_row(m, 0);
  const uint8_t* rows[kAdcBlock];
  for (int l = 0; l < lists.nlist(); ++l) {
    const std::vector<uint8_t>& codes = lists.codes[l];
    const int64_t n = static_cast<int64_t>(lists.ids[l].size());
    for (int64_t b = 0; b < n; b += kAdcBlock) {
      for (int i = 0; i < kAdcBlock; ++i) {
        rows[i] = b + i < n ? codes.data() + (b + i) * m : zero_row.data();
      }
      adc->kernels_.pack(rows, m, adc->lines_[(adc->block_begin_[l] + b / kAdcBlock) * m].bytes);
    }
    adc->ids_.insert(adc->ids_.end(), lists.ids[l].begin(), lists.ids[l].end());
    std::vector<uint8_t>().swap(lists.codes[l]);  // keep the peak near one copy of the codes
    std::vector<uint32_t>().swap(lists.ids[l]);
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

// b = Σ_m (||r_m||² + 2⟨c_l,m, r_m⟩) in double, from a per-list table of its m x 256 terms.
void IvfAdc::ComputeBiases(const std::vector<std::vector<uint8_t>>& codes) {
  const int m = codebook_.m, dsub = codebook_.dsub, d = dim();
  biases_.reserve(list_begin_.back());
  std::vector<double> terms(static_cast<size_t>(m) * kLutSize);
  std::vector<double> b;
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
    b.assign(n, 0.0);
    for (int64_t v = 0; v < n; ++v) {
      const uint8_t* code = codes[l].data() + v * m;
      for (int s = 0; s < m; ++s) b[v] += terms[s * kLutSize + code[s]];
    }
    const double low = n > 0 ? *std::min_element(b.begin(), b.end()) : 0.0;
    const double high = n > 0 ? *std::max_element(b.begin(), b.end()) : 0.0;
    const double step = (high - low) / 65535.0;
    bias_min_.push_back(low);
    bias_step_.push_back(step);
    for (int64_t v = 0; v < n; ++v) {
      const double steps = step > 0.0 ? std::floor((b[v] - low) / step) : 0.0;
      biases_.push_back(static_cast<uint16_t>(std::clamp(steps, 0.0, 65535.0)));
    }
  }
}

IvfAdc::~IvfAdc() = default;

double IvfAdc::BytesPerVector() const {
  if (ids_.empty()) return 0;
  return static_cast<double>(lines_.size() * sizeof(PackedLine) + ids_.size() * sizeof(uint32_t) +
                             biases_.size() * sizeof(uint16_t)) /
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
#pragma omp parallel if (queries.rows > 1)
  {
    // Per thread and kept between calls (tables of tens of KiB per row otherwise reallocated).
    thread_local Scratch scratch;
    // Contiguous rows per thread: a beam's hypotheses are adjacent rows that probe mostly the
    // same lists, whose codes then come from this core's cache.
#pragma omp for schedule(static)
    for (int64_t r = 0; r < queries.rows; ++r) {
      SearchRow(queries.row(r), probes.row(r), static_cast<int>(probes.cols), k, scratch, r, out);
    }
  }
  return out;
}

namespace {

constexpr double kNoBound = std::numeric_limits<double>::infinity();

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
void IvfAdc::OfferUpperBound(double upper, int k, Scratch& scratch) const {
  if (upper >= scratch.kth_bound) return;
  std::vector<double>& heap = scratch.upper_bounds;
  if (static_cast<int>(heap.size()) < k) {
    heap.push_back(upper);
    std::push_heap(heap.begin(), heap.end());
    if (static_cast<int>(heap.size()) == k) scratch.kth_bound = heap.front();
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
  scratch.kth_bound = heap.front();
}

double IvfAdc::KthBound(int k, const Scratch& scratch) const {
  if (static_cast<int>(scratch.heap.size()) < k) return scratch.kth_bound;
  return std::min<double>(scratch.kth_bound, scratch.heap.front().first);
}

// Survivors are kept with the bounds of their distances; the k smallest upper bounds so far (and
// the k-th exact distance, once known) cap the integer sums worth keeping in the next lists.
// Until k exact distances are known a list's survivors are re-ranked at once; after that they
// wait until every probed list is scanned, and are re-ranked nearest lower bound first until the
// k-th exact distance found is below the next lower bound. Re-ranking every list's survivors as
// it was scanned (the previous form) costed every vector that ranked among the first k of the
// lists seen so far: about k (1 + ln nprobe) per row instead of k plus those whose bounds
// straddle the k-th distance.
void IvfAdc::SearchRow(const float* query, const int64_t* probes, int nprobe, int k,
                       Scratch& scratch, int64_t row, Neighbors& out) const {
  const int m = codebook_.m;
  const int d = dim();
  const size_t table_size = static_cast<size_t>(m) * kLutSize;
  scratch.heap.clear();
  scratch.upper_bounds.clear();
  scratch.kth_bound = kNoBound;
  scratch.pending.clear();
  scratch.residuals.resize(static_cast<size_t>(nprobe) * d);
  scratch.x_norms.resize(nprobe);
  LutQuantization query_bounds;
  query_bounds.margin = LutQuantization::kKeepAll;  // unusable until built
  double query_norm = 0.0;
  if (options_.query_tables) {
    scratch.query_lut.resize(table_size);
    scratch.query_table.resize(table_size);
    float* lut = scratch.query_lut.data();
    tables_.residual_luts(&query, 1, centroids_t_.data(), zeros_.data(), m, codebook_.dsub, &lut);
    query_bounds = adc_internal::QuantizeLut(lut, m, Metric::kL2, scratch.query_table.data());
    for (int j = 0; j < d; ++j) query_norm += static_cast<double>(query[j]) * query[j];
    query_norm = std::sqrt(query_norm);
  }
  for (int p = 0; p < nprobe; ++p) {
    const int64_t list = probes[p];
    if (list < 0 || list_begin_[list] == list_begin_[list + 1]) continue;
    float* x = scratch.residuals.data() + static_cast<size_t>(p) * d;
    const float* centroid = coarse_centroids_.data() + list * d;
    float x_norm = 0.0f;
    for (int j = 0; j < d; ++j) {
      x[j] = query[j] - centroid[j];
      x_norm += x[j] * x[j];
    }
    scratch.x_norms[p] = x_norm;
    if (!query_bounds.keeps_all() &&
        ScanWithQueryTable(p, list, x_norm, query_norm, query_bounds, k, scratch)) {
      // Until k exact distances are known, a list's survivors are re-ranked at once: on
      // clustered keys the nearest lists hold most of the k nearest, and their exact k-th
      // distance caps the next lists far tighter than upper bounds do.
      if (static_cast<int>(scratch.heap.size()) < k) RerankPending(probes, k, scratch);
      continue;
    }
    ScanWithResidualTable(list, x, x_norm, k, scratch);
  }
  RerankPending(probes, k, scratch);
  adc_internal::WriteNearestFirst(Metric::kL2, scratch.heap, row, k, out);
}

// The pre-scan sum of a vector is Q = Q_T + B: Q_T its query-table sum, B = floor(β * ratio)
// its bias in table steps (ratio = the list's bias step / the table step). Its exact cost
// (distance − ||x||²) is b + Σ T up to float rounding, so with the table's window
// [base + step (Q_T − slack), base + step (Q_T + m + slack)) and b within
// [min + step (B − 1), min + step (B + 2 + ceil(ratio))], the cost lies within
// [base' + step (Q − slack'), base' + step (Q + upper)), base' = base + min,
// slack' = slack + extra, upper = m + slack + ceil(ratio) + extra, where `extra` steps cover
// the rounding of T's entries and sums, of the residual form, of x and of base' (bounded from
// the magnitudes by Cauchy-Schwarz, with a wide factor) plus the biases' flooring; the
// filter's margin is the window's width, upper + slack'.
bool IvfAdc::ScanWithQueryTable(int probe, int64_t list, float x_norm, double query_norm,
                                const LutQuantization& query_bounds, int k,
                                Scratch& scratch) const {
  const int m = codebook_.m;
  const double step = query_bounds.step;
  const double ratio = bias_step_[list] / step;
  const double bias_min = bias_min_[list];
  const double bias_max = bias_min + 65535.0 * bias_step_[list];
  const double magnitude = 2.0 * (query_norm + std::sqrt(x_norm)) * centroid_bound_ +
                           norms_max_sum_ + std::abs(bias_min) + std::abs(bias_max) + x_norm +
                           std::abs(query_bounds.base);
  const double rounding = 16.0 * (m + codebook_.dsub + 4) * FLT_EPSILON * magnitude / step;
  const double extra = std::ceil(rounding) + 2.0;
  const double slack = query_bounds.slack + extra;
  const double upper = m + query_bounds.slack + std::ceil(ratio) + extra;
  // Every sum must fit 16 bits unsaturated, with room for the filter's margin.
  if (255.0 * m + 65535.0 * ratio + 2.0 + upper + slack >= LutQuantization::kKeepAll) return false;
  LutQuantization bounds;
  bounds.base = static_cast<float>(query_bounds.base + bias_min);
  bounds.step = query_bounds.step;
  bounds.slack = static_cast<int>(slack);
  bounds.margin = static_cast<int>(upper + slack);
  const int64_t cap = SumCap(KthBound(k, scratch), bounds, x_norm);
  if (cap < 0) return true;  // nothing in this list can rank before the k bounded

  const int64_t first = list_begin_[list];
  const int64_t n = list_begin_[list + 1] - first;
  // Every position is written once: the list's biases, then zeros up to a whole block.
  const int64_t padded = (n + kAdcBlock - 1) / kAdcBlock * kAdcBlock;
  if (static_cast<int64_t>(scratch.biases.size()) < padded) scratch.biases.resize(padded);
  const float ratio_f = static_cast<float>(ratio);
  for (int64_t i = 0; i < n; ++i) {
    scratch.biases[i] = static_cast<uint16_t>(static_cast<float>(biases_[first + i]) * ratio_f);
  }
  std::fill(scratch.biases.begin() + n, scratch.biases.begin() + padded, uint16_t{0});
  // Once k distances are bounded, the cap is rarely beaten by the list's own k-th sum (a list
  // holds a fraction of the probed vectors), and keeping that sum costs a heap operation per
  // vector under the cap; DeferSurvivors still drops those the bound, lowered by the list's
  // own survivors, excludes.
  const bool capped = cap < LutQuantization::kKeepAll;
  scratch.filter.Reset(capped ? 0 : k, bounds.margin, static_cast<uint16_t>(cap));
  const uint8_t* table = scratch.query_table.data();
  const uint16_t* biases = scratch.biases.data();
  adc_internal::FilterPackedBlocks(kernels_, &table, 1, lines_.data() + block_begin_[list] * m, n,
                                   m, &biases, &scratch.filter);
  DeferSurvivors(probe, list, x_norm, bounds, k, scratch);
  return true;
}

// A survivor of sum Q costs within [base + step (Q − slack), base + step (Q − slack + margin)).
void IvfAdc::DeferSurvivors(int probe, int64_t list, float x_norm, const LutQuantization& bounds,
                            int k, Scratch& scratch) const {
  const uint32_t* ids = ids_.data() + list_begin_[list];
  for (const auto& [sum, position] : scratch.filter.Survivors()) {
    const double low_cost = bounds.base + static_cast<double>(bounds.step) * (sum - bounds.slack);
    const double lower = x_norm + low_cost - Rounding(low_cost, x_norm);
    if (lower > KthBound(k, scratch)) continue;
    const double high_cost = low_cost + static_cast<double>(bounds.step) * bounds.margin;
    scratch.pending.push_back({lower, position, probe, ids[position]});
    OfferUpperBound(x_norm + high_cost + Rounding(high_cost, x_norm), k, scratch);
  }
}

const float* IvfAdc::BuildResidualLut(const float* x, Scratch& scratch) const {
  scratch.residual_lut.resize(static_cast<size_t>(codebook_.m) * kLutSize);
  float* lut = scratch.residual_lut.data();
  tables_.residual_luts(&x, 1, centroids_t_.data(), norms_.data(), codebook_.m, codebook_.dsub,
                        &lut);
  return lut;
}

// Re-ranked at once: its residual table is built anyway, and the exact distances bound the
// k-th distance as tightly as anything can.
void IvfAdc::ScanWithResidualTable(int64_t list, const float* x, float x_norm, int k,
                                   Scratch& scratch) const {
  const int m = codebook_.m;
  const float* lut = BuildResidualLut(x, scratch);
  scratch.residual_table.resize(static_cast<size_t>(m) * kLutSize);
  const LutQuantization bounds =
      adc_internal::QuantizeLut(lut, m, Metric::kL2, scratch.residual_table.data());
  const int64_t cap = SumCap(KthBound(k, scratch), bounds, x_norm);
  if (cap < 0) return;
  scratch.filter.Reset(k, bounds.margin, static_cast<uint16_t>(cap));
  const uint8_t* table = scratch.residual_table.data();
  const PackedLine* blocks = lines_.data() + block_begin_[list] * m;
  adc_internal::FilterPackedBlocks(kernels_, &table, 1, blocks,
                                   list_begin_[list + 1] - list_begin_[list], m,
                                   /*biases=*/nullptr, &scratch.filter);
  for (const auto& survivor : scratch.filter.Survivors()) {
    const float distance = x_norm + adc_internal::PackedCost(lut, blocks, m, survivor.second);
    OfferExact(ids_[list_begin_[list] + survivor.second], distance, k, scratch);
    OfferUpperBound(distance, k, scratch);
  }
}

void IvfAdc::OfferExact(uint32_t id, float distance, int k, Scratch& scratch) const {
  adc_internal::OfferBounded(Metric::kL2, k, {distance, id}, scratch.heap);
}

// A survivor's exact cost from its list's residual table is m look-ups once the table is built
// (m x 256 x dsub fused multiply-adds, 16 at a time); without it, m x dsub scalar fused
// multiply-adds. A list with more than kResidualTableAbove survivors left to re-rank gets the
// table, and all of them are costed through it when the first comes up. Both give the same
// bits.
void IvfAdc::RerankPending(const int64_t* probes, int k, Scratch& scratch) const {
  constexpr int kResidualTableAbove = 16;
  const int m = codebook_.m;
  const int d = dim();
  std::vector<Pending>& pending = scratch.pending;
  const double kth_bound = KthBound(k, scratch);
  pending.erase(std::remove_if(pending.begin(), pending.end(),
                               [kth_bound](const Pending& c) { return c.lower > kth_bound; }),
                pending.end());
  std::sort(pending.begin(), pending.end(),
            [](const Pending& a, const Pending& b) { return a.lower < b.lower; });
  scratch.pending_per_probe.assign(scratch.x_norms.size(), 0);
  for (const Pending& c : pending) ++scratch.pending_per_probe[c.probe];
  for (size_t i = 0; i < pending.size(); ++i) {
    if (pending[i].position < 0) continue;  // costed with its list's table
    if (static_cast<int>(scratch.heap.size()) >= k &&
        pending[i].lower > scratch.heap.front().first) {
      break;  // its distance and every later one exceed the k-th found
    }
    const int probe = pending[i].probe;
    const int64_t list = probes[probe];
    const float* x = scratch.residuals.data() + static_cast<size_t>(probe) * d;
    const float x_norm = scratch.x_norms[probe];
    const PackedLine* blocks = lines_.data() + block_begin_[list] * m;
    if (scratch.pending_per_probe[probe] <= kResidualTableAbove) {
      const int64_t position = pending[i].position;
      adc_internal::CopyLaneCode(blocks + position / kAdcBlock * m, m,
                                 static_cast<int>(position % kAdcBlock), scratch.code);
      const float cost = tables_.residual_cost(x, scratch.code, codebook_.centroids.data(),
                                               norms_.data(), m, codebook_.dsub);
      OfferExact(pending[i].id, x_norm + cost, k, scratch);
      continue;
    }
    const float* lut = BuildResidualLut(x, scratch);
    for (size_t j = i; j < pending.size(); ++j) {
      if (pending[j].probe != probe || pending[j].position < 0) continue;
      const float cost = adc_internal::PackedCost(lut, blocks, m, pending[j].position);
      OfferExact(pending[j].id, x_norm + cost, k, scratch);
      pending[j].position = -1;
    }
  }
  pending.clear();  // those left rank after the k found, which only get nearer
}

}  // namespace knnserve
