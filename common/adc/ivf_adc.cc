#include "common/adc/ivf_adc.h"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/adc/two_stage.h"
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

struct IvfAdc::Scratch {
  std::vector<float> residual;       // dim: x = q − c_l
  std::vector<float> query_lut;      // m x 256: T of the query
  std::vector<uint8_t> query_table;  // and quantized
  std::vector<uint16_t> biases;      // per position of the list: its b in table steps
  std::vector<float> residual_lut;   // m x 256: the residual table of x (fallback)
  std::vector<uint8_t> residual_table;
  CandidateFilter filter;
  uint8_t code[kMaxAdcM];
  std::vector<float> costs;  // the survivors' exact costs
  std::vector<Candidate> heap;
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
  omp_set_num_threads(options_.threads);  // LibTorch may have set OpenMP to 1 thread.
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

// The largest integer sum worth keeping in a list whose distances are x_norm + cost (cost
// bounded by `bounds`), given the heap of the row: no limit until it holds k candidates; −1
// when nothing in the list can rank before them.
int64_t SumCap(const std::vector<Candidate>& heap, int k, const LutQuantization& bounds,
               float x_norm) {
  if (static_cast<int>(heap.size()) < k || bounds.keeps_all()) return LutQuantization::kKeepAll;
  // The worst distance so far, less the list's constant, widened by the rounding of adding it.
  const double worst = heap.front().first;
  const double rounding = 4.0 * FLT_EPSILON * (std::abs(worst) + x_norm);
  return bounds.LargestSumWithin(worst - x_norm + rounding);
}

}  // namespace

// Lists are scanned one after the other (nearest first) into one heap: once it holds k
// candidates, its worst distance caps the integer sums worth keeping in the next lists
// (LargestSumWithin), on top of each list's own k-th-sum filter, so most lists leave only a
// handful of survivors to re-rank.
void IvfAdc::SearchRow(const float* query, const int64_t* probes, int nprobe, int k,
                       Scratch& scratch, int64_t row, Neighbors& out) const {
  const int m = codebook_.m;
  const int d = dim();
  const size_t table_size = static_cast<size_t>(m) * kLutSize;
  scratch.heap.clear();
  scratch.residual.resize(d);
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
    float* x = scratch.residual.data();
    const float* centroid = coarse_centroids_.data() + list * d;
    float x_norm = 0.0f;
    for (int j = 0; j < d; ++j) {
      x[j] = query[j] - centroid[j];
      x_norm += x[j] * x[j];
    }
    if (!query_bounds.keeps_all() &&
        ScanWithQueryTable(list, x, x_norm, query_norm, query_bounds, k, scratch)) {
      continue;
    }
    ScanWithResidualTable(list, x, x_norm, k, scratch);
  }
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
bool IvfAdc::ScanWithQueryTable(int64_t list, const float* x, float x_norm, double query_norm,
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
  const int64_t cap = SumCap(scratch.heap, k, bounds, x_norm);
  if (cap < 0) return true;  // nothing in this list can rank before the k found

  const int64_t first = list_begin_[list];
  const int64_t n = list_begin_[list + 1] - first;
  scratch.biases.assign((n + kAdcBlock - 1) / kAdcBlock * kAdcBlock, uint16_t{0});
  const float ratio_f = static_cast<float>(ratio);
  for (int64_t i = 0; i < n; ++i) {
    scratch.biases[i] = static_cast<uint16_t>(static_cast<float>(biases_[first + i]) * ratio_f);
  }
  scratch.filter.Reset(k, bounds.margin, static_cast<uint16_t>(cap));
  const uint8_t* table = scratch.query_table.data();
  const uint16_t* biases = scratch.biases.data();
  adc_internal::FilterPackedBlocks(kernels_, &table, 1, lines_.data() + block_begin_[list] * m, n,
                                   m, &biases, &scratch.filter);
  OfferSurvivors(list, x, x_norm, k, /*residual_lut=*/nullptr, scratch);
  return true;
}

const float* IvfAdc::BuildResidualLut(const float* x, Scratch& scratch) const {
  scratch.residual_lut.resize(static_cast<size_t>(codebook_.m) * kLutSize);
  float* lut = scratch.residual_lut.data();
  tables_.residual_luts(&x, 1, centroids_t_.data(), norms_.data(), codebook_.m, codebook_.dsub,
                        &lut);
  return lut;
}

void IvfAdc::ScanWithResidualTable(int64_t list, const float* x, float x_norm, int k,
                                   Scratch& scratch) const {
  const int m = codebook_.m;
  const float* lut = BuildResidualLut(x, scratch);
  scratch.residual_table.resize(static_cast<size_t>(m) * kLutSize);
  const LutQuantization bounds =
      adc_internal::QuantizeLut(lut, m, Metric::kL2, scratch.residual_table.data());
  const int64_t cap = SumCap(scratch.heap, k, bounds, x_norm);
  if (cap < 0) return;
  scratch.filter.Reset(k, bounds.margin, static_cast<uint16_t>(cap));
  const uint8_t* table = scratch.residual_table.data();
  adc_internal::FilterPackedBlocks(kernels_, &table, 1, lines_.data() + block_begin_[list] * m,
                                   list_begin_[list + 1] - list_begin_[list], m,
                                   /*biases=*/nullptr, &scratch.filter);
  OfferSurvivors(list, x, x_norm, k, lut, scratch);
}

// A survivor's exact cost from its residual table is m look-ups once the table is built (m x 256
// x dsub fused multiply-adds, 16 at a time); without it, m x dsub scalar fused multiply-adds.
// Past kResidualTableAbove survivors in a list the table is cheaper. Both give the same bits.
void IvfAdc::OfferSurvivors(int64_t list, const float* x, float x_norm, int k,
                            const float* residual_lut, Scratch& scratch) const {
  constexpr size_t kResidualTableAbove = 16;
  const int m = codebook_.m;
  const PackedLine* blocks = lines_.data() + block_begin_[list] * m;
  const uint32_t* ids = ids_.data() + list_begin_[list];
  const auto& survivors = scratch.filter.Survivors();
  if (residual_lut == nullptr && survivors.size() > kResidualTableAbove) {
    residual_lut = BuildResidualLut(x, scratch);
  }
  if (residual_lut != nullptr) {
    adc_internal::ExactCostsOfSurvivors(residual_lut, blocks, m, survivors, scratch.costs);
  } else {
    scratch.costs.resize(survivors.size());
    for (size_t s = 0; s < survivors.size(); ++s) {
      const int64_t position = survivors[s].second;
      adc_internal::CopyLaneCode(blocks + position / kAdcBlock * m, m,
                                 static_cast<int>(position % kAdcBlock), scratch.code);
      scratch.costs[s] = tables_.residual_cost(x, scratch.code, codebook_.centroids.data(),
                                               norms_.data(), m, codebook_.dsub);
    }
  }
  for (size_t s = 0; s < survivors.size(); ++s) {
    adc_internal::OfferBounded(Metric::kL2, k,
                               {x_norm + scratch.costs[s], ids[survivors[s].second]}, scratch.heap);
  }
}

}  // namespace knnserve
