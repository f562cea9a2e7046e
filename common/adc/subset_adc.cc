#include "common/adc/subset_adc.h"

#include <omp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

constexpr int kLutSize = PqCodebook::kCentroids;
// Queries scanned together: their LUTs (m x 256 floats each, 64 KiB at m = 64) stay in L2.
constexpr int kMaxQueriesPerPass = 8;
// Codes per kernel call: bounds the distance buffer (kMaxQueriesPerPass x kBlock floats).
constexpr int64_t kBlock = 1024;

absl::Status CheckCodes(const PqCodebook& codebook, const SubsetCodes& codes) {
  if (codebook.m < 1 || codebook.m > kMaxAdcM || codebook.dsub < 1 ||
      codebook.centroids.size() != static_cast<size_t>(codebook.m) * kLutSize * codebook.dsub) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PQ codebook: m = ", codebook.m, " (1..", kMaxAdcM, "), dsub = ", codebook.dsub,
        ", centroids ", codebook.centroids.size(), " floats"));
  }
  if (codes.m != codebook.m) {
    return absl::InvalidArgumentError(
        absl::StrCat("subset codes have m = ", codes.m, ", the codebook m = ", codebook.m));
  }
  if (codes.offsets.empty() || codes.offsets[0] != 0) {
    return absl::InvalidArgumentError("subset offsets must start with 0");
  }
  for (size_t s = 1; s < codes.offsets.size(); ++s) {
    if (codes.offsets[s] < codes.offsets[s - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("subset offsets decrease at sentence ", s - 1));
    }
  }
  if (codes.codes.size() != static_cast<size_t>(codes.num_vectors()) * codes.m) {
    return absl::InvalidArgumentError(absl::StrCat("subset codes hold ", codes.codes.size(),
                                                   " bytes, offsets say ", codes.num_vectors(),
                                                   " vectors x ", codes.m));
  }
  return absl::OkStatus();
}

using Candidate = std::pair<float, int64_t>;  // distance, global token id

}  // namespace

void SubsetRanges(const SubsetCodes& codes, absl::Span<const int64_t> sentences,
                  std::vector<std::pair<int64_t, int64_t>>& ranges) {
  // Sentences of this slice in storage order, adjacent ones merged: the scan then reads memory
  // sequentially and calls the kernel on long runs.
  ranges.clear();
  std::vector<int64_t> local;
  local.reserve(sentences.size());
  for (int64_t s : sentences) {
    if (s >= codes.sentence_begin && s < codes.sentence_end()) {
      local.push_back(s - codes.sentence_begin);
    }
  }
  std::sort(local.begin(), local.end());
  local.erase(std::unique(local.begin(), local.end()), local.end());
  for (int64_t s : local) {
    const int64_t begin = codes.offsets[s];
    const int64_t end = codes.offsets[s + 1];
    if (begin == end) continue;
    if (!ranges.empty() && ranges.back().second == begin) {
      ranges.back().second = end;
    } else {
      ranges.emplace_back(begin, end);
    }
  }
}

absl::Status CheckSubsetSearch(int dim, MatrixView<const float> queries, const SubsetGroups& groups,
                               absl::Span<const int32_t> row_group, int k) {
  if (queries.cols != dim) {
    return absl::InvalidArgumentError(absl::StrCat("subset queries have dimension ", queries.cols,
                                                   ", the PQ codebook has ", dim));
  }
  if (k <= 0) return absl::InvalidArgumentError(absl::StrCat("k = ", k));
  if (static_cast<int64_t>(row_group.size()) != queries.rows) {
    return absl::InvalidArgumentError(absl::StrCat("row_group has ", row_group.size(),
                                                   " entries for ", queries.rows, " queries"));
  }
  for (int64_t r = 0; r < queries.rows; ++r) {
    const int32_t g = row_group[r];
    if (g < 0 || static_cast<size_t>(g) >= groups.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("query row ", r, " refers to subset group ", g, " of ", groups.size()));
    }
  }
  return absl::OkStatus();
}

struct SubsetAdc::Scratch {
  std::vector<float> luts;       // kMaxQueriesPerPass x m x 256
  std::vector<float> distances;  // kMaxQueriesPerPass x kBlock
  std::vector<std::vector<Candidate>> heaps;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // local token ranges to scan
};

absl::StatusOr<std::unique_ptr<SubsetAdc>> SubsetAdc::Create(PqCodebook codebook, Metric metric,
                                                             SubsetCodes codes, Options options) {
  RETURN_IF_ERROR(CheckCodes(codebook, codes));
  if (options.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads = ", options.threads));
  }
  if (!CpuSupports(options.kernel)) {
    return absl::FailedPreconditionError(
        absl::StrCat("this CPU cannot run the ", AdcKernelName(options.kernel), " ADC kernel"));
  }
  return std::unique_ptr<SubsetAdc>(
      new SubsetAdc(std::move(codebook), metric, std::move(codes), options));
}

SubsetAdc::SubsetAdc(PqCodebook codebook, Metric metric, SubsetCodes codes, Options options)
    : codebook_(std::move(codebook)),
      metric_(metric),
      codes_(std::move(codes)),
      options_(options),
      scan_(GetAdcScan(options.kernel)),
      centroids_t_(codebook_.centroids.size()) {
  const int dsub = codebook_.dsub;
  for (int m = 0; m < codebook_.m; ++m) {
    for (int c = 0; c < kLutSize; ++c) {
      for (int j = 0; j < dsub; ++j) {
        centroids_t_[(static_cast<size_t>(m) * dsub + j) * kLutSize + c] =
            codebook_.centroids[(static_cast<size_t>(m) * kLutSize + c) * dsub + j];
      }
    }
  }
}

void SubsetAdc::ComputeLut(const float* query, float* lut) const {
  const int dsub = codebook_.dsub;
  for (int m = 0; m < codebook_.m; ++m) {
    float* row = lut + m * kLutSize;
    std::fill(row, row + kLutSize, 0.0f);
    // Loop order j-outer, centroid-inner: the inner loop is contiguous and vectorises.
    for (int j = 0; j < dsub; ++j) {
      const float x = query[m * dsub + j];
      const float* ct = centroids_t_.data() + (static_cast<size_t>(m) * dsub + j) * kLutSize;
      if (metric_ == Metric::kL2) {
        for (int c = 0; c < kLutSize; ++c) {
          const float diff = x - ct[c];
          row[c] += diff * diff;
        }
      } else {
        for (int c = 0; c < kLutSize; ++c) row[c] += x * ct[c];
      }
    }
  }
}

absl::StatusOr<SubsetResult> SubsetAdc::SearchSubset(MatrixView<const float> queries,
                                                     const SubsetGroups& groups,
                                                     absl::Span<const int32_t> row_group,
                                                     int k) const {
  RETURN_IF_ERROR(CheckSubsetSearch(codebook_.dim(), queries, groups, row_group, k));
  std::vector<std::vector<int64_t>> group_rows(groups.size());
  for (int64_t r = 0; r < queries.rows; ++r) group_rows[row_group[r]].push_back(r);
  std::vector<int32_t> active;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!group_rows[g].empty()) active.push_back(static_cast<int32_t>(g));
  }

  SubsetResult result;
  result.neighbors = Neighbors::Missing(queries.rows, k, metric_, /*with_values=*/false);
  int64_t scanned = 0;
  omp_set_num_threads(options_.threads);  // LibTorch may have set OpenMP to 1 thread.
#pragma omp parallel reduction(+ : scanned) if (active.size() > 1)
  {
    Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (size_t a = 0; a < active.size(); ++a) {
      const int32_t g = active[a];
      scanned += SearchGroup(queries, groups[g], group_rows[g], k, scratch, result.neighbors);
    }
  }
  result.vectors_scanned = scanned;
  return result;
}

int64_t SubsetAdc::SearchGroup(MatrixView<const float> queries, absl::Span<const int64_t> sentences,
                               absl::Span<const int64_t> rows, int k, Scratch& scratch,
                               Neighbors& out) const {
  SubsetRanges(codes_, sentences, scratch.ranges);

  const int m = codebook_.m;
  const size_t lut_floats = static_cast<size_t>(m) * kLutSize;
  scratch.luts.resize(kMaxQueriesPerPass * lut_floats);
  scratch.distances.resize(kMaxQueriesPerPass * kBlock);
  scratch.heaps.resize(kMaxQueriesPerPass);
  const Metric metric = metric_;
  auto ranks_before = [metric](const Candidate& a, const Candidate& b) {
    return RanksBefore(metric, a.first, a.second, b.first, b.second);
  };

  // The group's vectors, searched for all its queries (counted once, however many passes).
  int64_t scanned = 0;
  for (const auto& [range_begin, range_end] : scratch.ranges) scanned += range_end - range_begin;
  for (size_t first = 0; first < rows.size(); first += kMaxQueriesPerPass) {
    const int nq = static_cast<int>(std::min<size_t>(kMaxQueriesPerPass, rows.size() - first));
    const float* lut_ptrs[kMaxQueriesPerPass];
    for (int q = 0; q < nq; ++q) {
      float* lut = scratch.luts.data() + q * lut_floats;
      ComputeLut(queries.row(rows[first + q]), lut);
      lut_ptrs[q] = lut;
      scratch.heaps[q].clear();
    }
    for (const auto& [range_begin, range_end] : scratch.ranges) {
      for (int64_t b = range_begin; b < range_end; b += kBlock) {
        const int64_t n = std::min(kBlock, range_end - b);
        scan_(lut_ptrs, nq, codes_.codes.data() + b * m, n, m, scratch.distances.data());
        const int64_t id0 = codes_.token_begin + b;
        for (int q = 0; q < nq; ++q) {
          std::vector<Candidate>& heap = scratch.heaps[q];
          const float* dist = scratch.distances.data() + q * n;
          for (int64_t i = 0; i < n; ++i) {
            const Candidate c{dist[i], id0 + i};
            if (static_cast<int>(heap.size()) < k) {
              heap.push_back(c);
              std::push_heap(heap.begin(), heap.end(), ranks_before);
            } else if (ranks_before(c, heap.front())) {
              std::pop_heap(heap.begin(), heap.end(), ranks_before);
              heap.back() = c;
              std::push_heap(heap.begin(), heap.end(), ranks_before);
            }
          }
        }
      }
    }
    for (int q = 0; q < nq; ++q) {
      std::vector<Candidate>& heap = scratch.heaps[q];
      std::sort_heap(heap.begin(), heap.end(), ranks_before);
      const int64_t r = rows[first + q];
      for (size_t j = 0; j < heap.size(); ++j) {
        out.distances[r * k + j] = heap[j].first;
        out.ids[r * k + j] = heap[j].second;
      }
    }
  }
  return scanned;
}

}  // namespace knnserve
