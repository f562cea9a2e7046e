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
  std::vector<float> residuals;       // nprobe x dim: q − c_l
  std::vector<float> residual_norms;  // nprobe: ||q − c_l||²
  std::vector<float> luts;            // nprobe x m x 256: the residuals' tables
  std::vector<int64_t> lists;         // the non-empty probed lists, nearest first
  std::vector<const float*> residual_rows;
  std::vector<float*> lut_rows;
  std::vector<uint8_t> table;
  CandidateFilter filter;
  std::vector<uint8_t> codes;  // the survivors' codes, vector after vector
  std::vector<float> costs;    // and their exact costs
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
      exact_(GetAdcScan(BestExactAdcKernel())),
      tables_(BestAdcTableKernels()),
      centroids_t_(adc_internal::TransposeCentroids(codebook_)),
      norms_(static_cast<size_t>(codebook_.m) * kLutSize) {
  for (size_t i = 0; i < norms_.size(); ++i) {
    const float* r = codebook_.centroids.data() + i * codebook_.dsub;
    float norm = 0.0f;
    for (int j = 0; j < codebook_.dsub; ++j) norm += r[j] * r[j];
    norms_[i] = norm;
  }
}

IvfAdc::~IvfAdc() = default;

double IvfAdc::BytesPerVector() const {
  if (ids_.empty()) return 0;
  return static_cast<double>(lines_.size() * sizeof(PackedLine) + ids_.size() * sizeof(uint32_t)) /
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

// Lists are scanned one after the other (nearest first) into one heap: once it holds k
// candidates, its worst distance caps the integer sums worth keeping in the next lists
// (LargestSumWithin), on top of each list's own k-th-sum filter, so most lists leave only a
// handful of survivors to re-rank.
void IvfAdc::SearchRow(const float* query, const int64_t* probes, int nprobe, int k,
                       Scratch& scratch, int64_t row, Neighbors& out) const {
  const int m = codebook_.m;
  const int d = dim();
  const size_t table_size = static_cast<size_t>(m) * kLutSize;
  scratch.residuals.resize(static_cast<size_t>(nprobe) * d);
  scratch.residual_norms.resize(nprobe);
  scratch.luts.resize(nprobe * table_size);
  scratch.table.resize(table_size);
  scratch.heap.clear();
  scratch.lists.clear();
  scratch.residual_rows.clear();
  scratch.lut_rows.clear();
  for (int p = 0; p < nprobe; ++p) {
    const int64_t list = probes[p];
    if (list < 0 || list_begin_[list] == list_begin_[list + 1]) continue;
    const size_t i = scratch.lists.size();
    float* residual = scratch.residuals.data() + i * d;
    const float* centroid = coarse_centroids_.data() + list * d;
    float norm = 0.0f;
    for (int j = 0; j < d; ++j) {
      residual[j] = query[j] - centroid[j];
      norm += residual[j] * residual[j];
    }
    scratch.residual_norms[i] = norm;
    scratch.lists.push_back(list);
    scratch.residual_rows.push_back(residual);
    scratch.lut_rows.push_back(scratch.luts.data() + i * table_size);
  }
  // All tables of the row at once: the PQ centroids are then read once per row, not per list.
  tables_.residual_luts(scratch.residual_rows.data(), static_cast<int>(scratch.lists.size()),
                        centroids_t_.data(), norms_.data(), m, codebook_.dsub,
                        scratch.lut_rows.data());
  for (size_t i = 0; i < scratch.lists.size(); ++i) {
    const int64_t list = scratch.lists[i];
    const float* lut = scratch.lut_rows[i];
    const float residual_norm = scratch.residual_norms[i];  // added to every distance of the list
    const LutQuantization quantization =
        adc_internal::QuantizeLut(lut, m, Metric::kL2, scratch.table.data());
    int64_t cap = LutQuantization::kKeepAll;
    if (static_cast<int>(scratch.heap.size()) == k && !quantization.keeps_all()) {
      // The worst distance so far, less this list's constant, widened by the rounding of
      // adding that constant.
      const double worst = scratch.heap.front().first;
      const double rounding = 4.0 * FLT_EPSILON * (std::abs(worst) + residual_norm);
      cap = quantization.LargestSumWithin(worst - residual_norm + rounding);
      if (cap < 0) continue;  // nothing in this list can rank before the k found
    }
    scratch.filter.Reset(k, quantization.margin, static_cast<uint16_t>(cap));

    const int64_t n = list_begin_[list + 1] - list_begin_[list];
    const PackedLine* blocks = lines_.data() + block_begin_[list] * m;
    const uint8_t* table = scratch.table.data();
    adc_internal::FilterPackedBlocks(kernels_, &table, 1, blocks, n, m, &scratch.filter);
    const auto& survivors = scratch.filter.Survivors();
    adc_internal::ExactCostsOfSurvivors(exact_, lut, blocks, m, survivors, scratch.codes,
                                        scratch.costs);
    const uint32_t* ids = ids_.data() + list_begin_[list];
    for (size_t s = 0; s < survivors.size(); ++s) {
      adc_internal::OfferBounded(Metric::kL2, k,
                                 {residual_norm + scratch.costs[s], ids[survivors[s].second]},
                                 scratch.heap);
    }
  }
  adc_internal::WriteNearestFirst(Metric::kL2, scratch.heap, row, k, out);
}

}  // namespace knnserve
