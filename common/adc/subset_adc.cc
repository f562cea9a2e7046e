#include "common/adc/subset_adc.h"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <iterator>
#include <list>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/adc/two_stage.h"
#include "common/omp_threads.h"
#include "common/parallel_exceptions.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

using adc_internal::Candidate;
using adc_internal::CandidateFilter;
using adc_internal::LutQuantization;
using adc_internal::OfferBounded;
using adc_internal::PackedLine;
using adc_internal::QuantizeLut;
using adc_internal::WriteNearestFirst;

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
  if (!std::is_sorted(local.begin(), local.end())) {  // parsed groups arrive sorted
    std::sort(local.begin(), local.end());
  }
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
  adc_internal::AlignedVector<float> luts;       // kMaxQueriesPerPass x m x 256
  adc_internal::AlignedVector<float> distances;  // kMaxQueriesPerPass x kBlock
  std::vector<std::vector<Candidate>> heaps;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // local token ranges to scan
  // Quantized kernels only.
  adc_internal::AlignedVector<uint8_t> tables;  // kMaxQueriesPerPass x m x 256
  std::vector<CandidateFilter> filters;
  // The last subset packed here without being cached (no cache, or too large for it).
  std::shared_ptr<PackedSubset> packed;
};

// A group's codes packed for the quantized scan, with the runs they came from (the cache key).
// Scan position p is the (p - starts[r])-th token of run r, for the run whose start precedes it.
struct SubsetAdc::PackedSubset {
  Ranges ranges;
  std::vector<int64_t> starts;      // ranges.size() + 1 scan positions; starts.back() = size()
  adc_internal::PackedLines lines;  // one block (m lines) per kAdcBlock positions

  int64_t size() const { return starts.back(); }
  // The local token at scan position p. REQUIRES: 0 <= p < size().
  int64_t Token(int64_t p) const {
    const size_t r = std::upper_bound(starts.begin(), starts.end(), p) - starts.begin() - 1;
    return ranges[r].first + (p - starts[r]);
  }
  // Memory held by a packed subset of `runs` runs and `positions` positions of m code bytes.
  static size_t Bytes(size_t runs, int64_t positions, int m) {
    const size_t blocks = static_cast<size_t>((positions + kAdcBlock - 1) / kAdcBlock);
    return blocks * m * sizeof(PackedLine) + (runs + 1) * sizeof(int64_t) +
           runs * sizeof(Ranges::value_type);
  }
  size_t bytes() const { return Bytes(ranges.size(), size(), m); }

  int m = 0;  // lines per block
};

// Thread-safe LRU of packed subsets, bounded in bytes, keyed by their runs. Entries are immutable
// and shared: a search keeps using the one it found even if it is evicted meanwhile. Each entry
// remembers the groups of the last search that packed or found it (its owner), and an entry
// whose owner nobody holds any more is dropped before the cache grows much further: a decoding
// batch's subsets are never searched again once its session ends, and kept until the cache was
// full (256 MiB, a thousand sentences' subsets at the demo's size) every new subset was fresh
// memory, one page fault per 4 KiB written: about as much time as the packing itself. Dropped,
// their memory goes back to malloc, which hands it to the next subsets packed. An unowned entry
// that changed hands since the last sweep (found by a call holding other, equal groups) gets one
// more sweep: a unary client sends its groups anew with every request, so nobody holds them
// between its requests, and without that second chance every other caller's packing swept that
// client's subsets between two of its steps. A session's steps pass the same groups and never
// change hands, so an ended session's subsets go at the next sweep, as before (a second chance
// for every entry found since a sweep kept 5% more resident memory in the demo's subset kNN-MT).
class SubsetAdc::PackedCache {
 public:
  explicit PackedCache(size_t capacity) : capacity_(capacity) {}

  size_t capacity() const { return capacity_; }

  std::shared_ptr<const PackedSubset> Find(const Ranges& ranges,
                                           const std::shared_ptr<const SubsetGroups>& owner) {
    absl::MutexLock lock(&mu_);
    const auto it = index_.find(Key(ranges));
    // A hash collision must not hand out another subset's codes.
    if (it == index_.end() || it->second->packed->ranges != ranges) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    Entry& entry = *it->second;
    if (entry.owner.lock() != owner) {
      entry.changed_hands_since_sweep = true;
      entry.owner = owner;
    }
    return it->second->packed;
  }

  void Insert(std::shared_ptr<const PackedSubset> packed,
              const std::shared_ptr<const SubsetGroups>& owner) {
    if (packed->bytes() > capacity_) return;
    const uint64_t key = Key(packed->ranges);
    std::vector<std::shared_ptr<const PackedSubset>> dropped;  // freed after the lock is released
    absl::MutexLock lock(&mu_);
    // Every eighth of the entries inserted, the unowned ones go: a sweep per insert would cost
    // O(entries) each time, and this keeps it O(1) per insert amortized.
    if (++inserts_since_sweep_ * 8 >= lru_.size()) {
      for (auto entry = lru_.begin(); entry != lru_.end();) {
        auto next = std::next(entry);
        if (entry->owner.expired() && !entry->changed_hands_since_sweep) {
          dropped.push_back(Erase(entry));
        } else {
          entry->changed_hands_since_sweep = false;
        }
        entry = next;
      }
      inserts_since_sweep_ = 0;
    }
    if (const auto it = index_.find(key); it != index_.end()) dropped.push_back(Erase(it->second));
    used_ += packed->bytes();
    lru_.push_front({key, std::move(packed), owner});
    index_[key] = lru_.begin();
    while (used_ > capacity_) dropped.push_back(Erase(std::prev(lru_.end())));
  }

  size_t used() const {
    absl::MutexLock lock(&mu_);
    return used_;
  }

 private:
  struct Entry {
    uint64_t key;
    std::shared_ptr<const PackedSubset> packed;
    std::weak_ptr<const SubsetGroups> owner;
    bool changed_hands_since_sweep = false;  // found by a call holding other groups
  };

  static uint64_t Key(const Ranges& ranges) { return absl::Hash<Ranges>{}(ranges); }

  // Removes `entry` and returns its subset, for the caller to release outside the lock.
  std::shared_ptr<const PackedSubset> Erase(std::list<Entry>::iterator entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::shared_ptr<const PackedSubset> packed = std::move(entry->packed);
    used_ -= packed->bytes();
    index_.erase(entry->key);
    lru_.erase(entry);
    return packed;
  }

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  absl::flat_hash_map<uint64_t, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  size_t used_ ABSL_GUARDED_BY(mu_) = 0;
  size_t inserts_since_sweep_ ABSL_GUARDED_BY(mu_) = 0;
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
      quantized_(IsQuantized(options.kernel) ? GetQuantizedKernels(options.kernel)
                                             : QuantizedAdcKernels{nullptr, nullptr}),
      lut_(BestAdcLut()),
      cache_(options.packed_cache_bytes > 0 && IsQuantized(options.kernel)
                 ? std::make_unique<PackedCache>(options.packed_cache_bytes)
                 : nullptr),
      centroids_t_(adc_internal::TransposeCentroids(codebook_)) {}

SubsetAdc::~SubsetAdc() = default;

size_t SubsetAdc::packed_bytes_cached() const { return cache_ == nullptr ? 0 : cache_->used(); }

void SubsetAdc::ComputeLut(const float* query, float* lut) const {
  lut_(query, centroids_t_.data(), codebook_.m, codebook_.dsub, metric_ == Metric::kL2, lut);
}

absl::StatusOr<SubsetResult> SubsetAdc::SearchSubset(
    MatrixView<const float> queries, const std::shared_ptr<const SubsetGroups>& shared_groups,
    absl::Span<const int32_t> row_group, int k) const {
  const SubsetGroups& groups = *shared_groups;
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
  const ScopedOmpThreads scoped_threads(options_.threads);
  ParallelExceptions exceptions;
#pragma omp parallel reduction(+ : scanned) if (active.size() > 1)
  {
    // Per thread and kept between calls: the tables alone are hundreds of KiB, and allocating
    // (and zeroing) them per call cost more than scanning a small subset.
    thread_local Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (size_t a = 0; a < active.size(); ++a) {
      exceptions.Run([&] {
        const int32_t g = active[a];
        scanned +=
            IsQuantized(options_.kernel)
                ? SearchGroupQuantized(queries, groups[g], shared_groups, group_rows[g], k, scratch,
                                       result.neighbors)
                : SearchGroup(queries, groups[g], group_rows[g], k, scratch, result.neighbors);
      });
    }
  }
  RETURN_IF_ERROR(exceptions.ToStatus("subset ADC search"));
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
          const float* dist = scratch.distances.data() + q * n;
          for (int64_t i = 0; i < n; ++i) {
            OfferBounded(metric_, k, {dist[i], id0 + i}, scratch.heaps[q]);
          }
        }
      }
    }
    for (int q = 0; q < nq; ++q) {
      WriteNearestFirst(metric_, scratch.heaps[q], rows[first + q], k, out);
    }
  }
  return scanned;
}

std::shared_ptr<const SubsetAdc::PackedSubset> SubsetAdc::Packed(
    const Ranges& ranges, const std::shared_ptr<const SubsetGroups>& owner,
    Scratch& scratch) const {
  if (cache_ != nullptr) {
    if (std::shared_ptr<const PackedSubset> hit = cache_->Find(ranges, owner)) return hit;
  }
  // A subset the cache cannot hold (or every subset, without a cache) overwrites the thread's
  // previous one: its memory is reused, where fresh buffers of megabytes per call cost a page
  // fault per 4 KiB (more than the packing).
  const int m = codebook_.m;
  int64_t positions = 0;
  for (const auto& [begin, end] : ranges) positions += end - begin;
  const bool keep =
      cache_ != nullptr && PackedSubset::Bytes(ranges.size(), positions, m) <= cache_->capacity();
  std::shared_ptr<PackedSubset> packed;
  if (keep) {
    packed = std::make_shared<PackedSubset>();
  } else {
    if (scratch.packed == nullptr) scratch.packed = std::make_shared<PackedSubset>();
    packed = scratch.packed;
  }
  packed->m = m;
  packed->ranges = ranges;
  packed->starts.assign(1, 0);
  for (const auto& [begin, end] : ranges) packed->starts.push_back(packed->size() + end - begin);
  packed->lines.resize((packed->size() + kAdcBlock - 1) / kAdcBlock * m);
  // The runs' codes, kAdcBlock lanes per block; lanes past the end read zero codes.
  const std::vector<uint8_t> zero_row(m, 0);
  const uint8_t* lane_rows[kAdcBlock];
  int lane = 0;
  PackedLine* block = packed->lines.data();
  auto pack_block = [&] {
    std::fill(lane_rows + lane, lane_rows + kAdcBlock, zero_row.data());
    quantized_.pack(lane_rows, m, block->bytes);
    block += m;
    lane = 0;
  };
  for (const auto& [begin, end] : ranges) {
    for (int64_t t = begin; t < end; ++t) {
      lane_rows[lane++] = codes_.codes.data() + t * m;
      if (lane == kAdcBlock) pack_block();
    }
  }
  if (lane > 0) pack_block();
  if (keep) cache_->Insert(packed, owner);
  return packed;
}

int64_t SubsetAdc::SearchGroupQuantized(MatrixView<const float> queries,
                                        absl::Span<const int64_t> sentences,
                                        const std::shared_ptr<const SubsetGroups>& owner,
                                        absl::Span<const int64_t> rows, int k, Scratch& scratch,
                                        Neighbors& out) const {
  SubsetRanges(codes_, sentences, scratch.ranges);
  const std::shared_ptr<const PackedSubset> packed = Packed(scratch.ranges, owner, scratch);
  const int64_t n = packed->size();
  const int m = codebook_.m;
  const size_t lut_size = static_cast<size_t>(m) * kLutSize;
  scratch.luts.resize(kMaxQueriesPerPass * lut_size);
  scratch.tables.resize(kMaxQueriesPerPass * lut_size);
  scratch.filters.resize(kMaxQueriesPerPass);
  scratch.heaps.resize(kMaxQueriesPerPass);
  for (size_t first = 0; first < rows.size(); first += kMaxQueriesPerPass) {
    const int nq = static_cast<int>(std::min<size_t>(kMaxQueriesPerPass, rows.size() - first));
    const uint8_t* tables[kMaxQueriesPerPass];
    LutQuantization quantizations[kMaxQueriesPerPass];
    for (int q = 0; q < nq; ++q) {
      float* lut = scratch.luts.data() + q * lut_size;
      ComputeLut(queries.row(rows[first + q]), lut);
      uint8_t* table = scratch.tables.data() + q * lut_size;
      quantizations[q] = QuantizeLut(lut, m, metric_, table);
      scratch.filters[q].Reset(k, quantizations[q].margin);
      tables[q] = table;
    }
    // Stage 1: the filters keep the positions that may be among the k nearest.
    adc_internal::FilterPackedBlocks(quantized_, tables, nq, packed->lines.data(), n, m,
                                     /*biases=*/nullptr, scratch.filters.data());
    // Stage 2: exact distances of the survivors that can still rank.
    for (int q = 0; q < nq; ++q) {
      RankSurvivors(scratch.luts.data() + q * lut_size, quantizations[q], *packed, k,
                    scratch.filters[q], scratch.heaps[q]);
      WriteNearestFirst(metric_, scratch.heaps[q], rows[first + q], k, out);
    }
  }
  return n;
}

// The survivors with the k smallest sums fill the heap first; after that a survivor is costed
// only if its sum can still reach the heap's current worst distance (LargestSumWithin), a bound
// that tightens as the heap improves. A survivor skipped that way has an exact cost beyond some
// worst distance the heap held, so it cannot be among the final k: the answer is unchanged. The
// filter's window is m + 2 slack steps wide, while the k-th vector's own rounding is about m / 2
// steps; on random codes (M 64, k 64, 3,200 codes) 105 of 160 survivors per query are costed.
void SubsetAdc::RankSurvivors(const float* lut, const LutQuantization& quantization,
                              const PackedSubset& packed, int k, CandidateFilter& filter,
                              std::vector<Candidate>& heap) const {
  const int m = codebook_.m;
  const auto& survivors = filter.Survivors();
  const uint16_t kth_sum = filter.kth_sum();
  heap.clear();
  auto offer = [&](int64_t position) {
    const float distance = adc_internal::PackedCost(lut, packed.lines.data(), m, position);
    OfferBounded(metric_, k, {distance, codes_.token_begin + packed.Token(position)}, heap);
  };
  for (const auto& [sum, position] : survivors) {
    if (sum <= kth_sum) offer(position);
  }
  if (quantization.keeps_all()) {
    for (const auto& [sum, position] : survivors) {
      if (sum > kth_sum) offer(position);
    }
    return;
  }
  // For inner product the cost is −distance (QuantizeLut's sign).
  auto largest_useful_sum = [&] {
    if (static_cast<int>(heap.size()) < k) return int64_t{LutQuantization::kKeepAll};
    const float worst = heap.front().first;
    return quantization.LargestSumWithin(metric_ == Metric::kL2 ? worst : -worst);
  };
  int64_t within = largest_useful_sum();
  for (const auto& [sum, position] : survivors) {
    if (sum <= kth_sum || sum > within) continue;
    offer(position);
    within = largest_useful_sum();
  }
}

}  // namespace knnserve
