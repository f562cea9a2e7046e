// CUDA subset ADC (see adc_cuda_kernels.h).
//
// One call runs these kernels on the calling thread's per-thread stream:
//  1. positions: the local token of every position of every group, from the groups' ranges;
//  2. tables: one block per (query, sub-quantizer), one thread per centroid, LutScalar's
//     operations in its order (__fsub_rn/__fmul_rn/__fadd_rn: never contracted to an FMA);
//  3. tiles: a block per (tile of kTile positions, query) copies the query's table to shared
//     memory (64 KiB at m = 64), sums the table entries of each position's code in the CPU's
//     canonical order (__fadd_rn, so the sums equal the CPU's), sorts the tile by (distance,
//     position) in shared memory and keeps its best min(k, kTile) as the query's candidates;
//  4. reductions, while a query has many candidates: the same block sort over kTile candidates
//     at a time keeps the best min(k, kTile) of each chunk;
//  5. one stable segmented radix sort of each query's remaining candidates (CUB), then a gather
//     of each query's first k.
// Candidates stay in position order wherever their distances tie, so ties rank by ascending
// token as on the CPU. Host inputs travel in one copy from page-locked memory, and every device
// buffer of a call is carved from one stream-ordered allocation.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>
#include <mutex>
#include <vector>

#include "common/adc/cuda/adc_cuda_kernels.h"

namespace knnserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGridY = 65535;
constexpr size_t kAlign = 256;
// Positions per block: a block reads its query's table (m KiB) once for kTile codes (kTile * m
// bytes), so the table costs an eighth of the code traffic.
constexpr int kItems = 8;
constexpr int kTile = kItems * kThreads;
constexpr int kTileBits = 11;  // kTile == 1 << kTileBits
static_assert(kTile == 1 << kTileBits);
// Sort keys are (ordered distance bits) << kTileBits | offset in the tile or chunk; a key with
// every bit of that range set pads missing entries (no finite distance orders that high).
constexpr int kKeyBits = 32 + kTileBits;
constexpr uint64_t kPadKey = (uint64_t{1} << kKeyBits) - 1;
// Candidates per query above which another reduction pass runs before the device-wide sort
// (which sorts a large segment with one block).
constexpr int64_t kFinalSortLimit = 4 * kTile;

using BlockSort = cub::BlockRadixSort<uint64_t, kThreads, kItems>;

std::string ErrorText(cudaError_t e) { return e == cudaSuccess ? "" : cudaGetErrorString(e); }

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Consecutive aligned slices of one buffer: Add() reserves and returns the slice's offset.
class Layout {
 public:
  template <typename T>
  size_t Add(size_t count) {
    const size_t at = bytes_;
    bytes_ += AlignUp(count * sizeof(T));
    return at;
  }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
};

template <typename T>
T* At(char* base, size_t at) {
  return reinterpret_cast<T*>(base + at);
}

// Sums one code's table entries into the 16 canonical partials, then folds them as the CPU does.
__device__ float CodeDistance(const float* lut, const uint8_t* code, int m_count) {
  float acc[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) acc[j] = 0.0f;
  const int full = m_count / 16 * 16;
  if (m_count % 16 == 0) {
    // token * m_count is a multiple of 16 and device buffers are 256-aligned.
    const uint4* words = reinterpret_cast<const uint4*>(code);
    for (int mb = 0; mb < full; mb += 16) {
      const uint4 w = __ldg(words + mb / 16);
      const uint32_t parts[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const uint32_t c = (parts[j / 4] >> (8 * (j % 4))) & 0xffu;
        acc[j] = __fadd_rn(acc[j], lut[(mb + j) * 256 + c]);
      }
    }
  } else {
    for (int mb = 0; mb < full; mb += 16) {
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[j] = __fadd_rn(acc[j], lut[(mb + j) * 256 + code[mb + j]]);
    }
    for (int m = full; m < m_count; ++m) {
      acc[m - full] = __fadd_rn(acc[m - full], lut[m * 256 + code[m]]);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], acc[j + 8]);
#pragma unroll
  for (int j = 0; j < 4; ++j) acc[j] = __fadd_rn(acc[j], acc[j + 4]);
#pragma unroll
  for (int j = 0; j < 2; ++j) acc[j] = __fadd_rn(acc[j], acc[j + 2]);
  // + 0.0f turns a -0.0 sum into +0.0: the radix sort would rank -0.0 before +0.0, where the
  // CPU's comparison ties them.
  return __fadd_rn(acc[0], acc[1]) + 0.0f;
}

// What the tile kernel reads, in device memory.
struct DeviceScan {
  int m_count;
  int num_queries;
  const float* luts;                // num_queries x m_count x 256, written by LutKernel
  int kept_per_tile;                // min(k, kTile)
  const int64_t* candidate_offset;  // num_queries + 1: query q's candidates [off[q], off[q + 1])
  const int32_t* query_group;
  // Group g's positions are tokens[group_position[g] .. group_position[g + 1] - 1].
  const int64_t* group_position;  // num_groups + 1
  const int64_t* tokens;          // local token of every position of every group
};

// lut[q][m * 256 + c], as LutScalar computes it.
__global__ void LutKernel(const float* __restrict__ queries, const float* __restrict__ centroids_t,
                          int m_count, int dsub, bool l2, float* __restrict__ luts) {
  const int m = blockIdx.y, c = threadIdx.x;
  const int64_t q = blockIdx.x;
  const float* x = queries + q * m_count * dsub + m * dsub;
  const float* ct = centroids_t + static_cast<int64_t>(m) * dsub * 256 + c;
  float acc = 0.0f;
  for (int j = 0; j < dsub; ++j) {
    if (l2) {
      const float diff = __fsub_rn(x[j], ct[j * 256]);
      acc = __fadd_rn(acc, __fmul_rn(diff, diff));
    } else {
      acc = __fadd_rn(acc, __fmul_rn(x[j], ct[j * 256]));
    }
  }
  luts[(q * m_count + m) * 256 + c] = acc;
}

// tokens[p] for every flattened position p < num_positions: range r (the last whose start is at
// or before p; starts ascend strictly) holds tokens range_begin[r], range_begin[r] + 1, ...
__global__ void ExpandPositionsKernel(const int64_t* __restrict__ range_begin,
                                      const int64_t* __restrict__ range_start, int64_t num_ranges,
                                      int64_t num_positions, int64_t* __restrict__ tokens) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= num_positions) return;
  int64_t lo = 0, hi = num_ranges - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (range_start[mid] <= p) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  tokens[p] = range_begin[lo] + (p - range_start[lo]);
}

// Float bits mapped so that unsigned order is rank order: ascending distance (L2) or
// descending (inner product). Invertible by RankedDistance.
__device__ uint32_t RankBits(float distance, bool descending) {
  const uint32_t b = __float_as_uint(distance);
  const uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return descending ? ~ascending : ascending;
}

__device__ float RankedDistance(uint32_t bits, bool descending) {
  const uint32_t ascending = descending ? ~bits : bits;
  return __uint_as_float((ascending & 0x80000000u) ? (ascending & 0x7fffffffu) : ~ascending);
}

// Sorts the block's keys (kItems per thread; (rank bits) << kTileBits | offset, or kPadKey) and
// writes the best `kept` in rank order: the distance and offset_tokens[offset], or (pad, -1).
// Keys are distinct (the offset is in them), so the order is exactly (rank, offset).
__device__ void KeepBest(typename BlockSort::TempStorage& storage, uint64_t (&keys)[kItems],
                         int kept, bool descending, float pad, const int64_t* offset_tokens,
                         float* out_distances, int64_t* out_tokens) {
  BlockSort(storage).Sort(keys, 0, kKeyBits);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int rank = threadIdx.x * kItems + i;  // blocked after the sort
    if (rank >= kept) continue;
    if (keys[i] == kPadKey) {
      out_distances[rank] = pad;
      out_tokens[rank] = -1;
    } else {
      out_distances[rank] = RankedDistance(static_cast<uint32_t>(keys[i] >> kTileBits), descending);
      out_tokens[rank] = offset_tokens[keys[i] & (kTile - 1)];
    }
  }
}

// Block (x, y) scores positions [x * kTile, (x + 1) * kTile) for queries y, y + gridDim.y, ...
// and writes each query's best kept_per_tile of them to its candidates
// [candidate_offset[q] + x * kept_per_tile, + kept_per_tile) (pads past the group's end).
// kSharedLut: the query's table is staged in dynamic shared memory (else read from global
// memory, for tables larger than a block's shared memory).
template <bool kSharedLut>
__global__ void TileKernel(const uint8_t* __restrict__ codes, DeviceScan scan, bool descending,
                           float pad, float* __restrict__ distances, int64_t* __restrict__ tokens) {
  __shared__ typename BlockSort::TempStorage sort_storage;
  extern __shared__ float shared_lut[];
  const int64_t tile_begin = static_cast<int64_t>(blockIdx.x) * kTile;
  const int lut_floats = scan.m_count * 256;
  for (int q = blockIdx.y; q < scan.num_queries; q += gridDim.y) {
    const int g = scan.query_group[q];
    const int64_t* tile_tokens = scan.tokens + scan.group_position[g] + tile_begin;
    const int64_t total = scan.group_position[g + 1] - scan.group_position[g];
    // Block-uniform: the whole block skips or the whole block reaches the barriers.
    if (tile_begin >= total) continue;
    __syncthreads();  // the previous query's table and sort storage are no longer read
    const float* lut = scan.luts + static_cast<int64_t>(q) * lut_floats;
    if constexpr (kSharedLut) {
      for (int i = threadIdx.x; i < lut_floats; i += blockDim.x) shared_lut[i] = lut[i];
      __syncthreads();
      lut = shared_lut;
    }
    const int64_t valid = min(static_cast<int64_t>(kTile), total - tile_begin);
    uint64_t keys[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      // Striped: neighbouring threads read neighbouring codes.
      const int offset = i * kThreads + threadIdx.x;
      keys[i] = kPadKey;
      if (offset < valid) {
        const float d = CodeDistance(lut, codes + tile_tokens[offset] * scan.m_count, scan.m_count);
        keys[i] = static_cast<uint64_t>(RankBits(d, descending)) << kTileBits | offset;
      }
    }
    const int64_t out =
        scan.candidate_offset[q] + blockIdx.x * static_cast<int64_t>(scan.kept_per_tile);
    KeepBest(sort_storage, keys, scan.kept_per_tile, descending, pad, tile_tokens, distances + out,
             tokens + out);
  }
}

// One reduction pass: block (x, y) keeps the best `kept` of candidates
// [in_offset[q] + x * kTile, + kTile) of queries q = y, y + gridDim.y, ... at
// out_offset[q] + x * kept (pads, token -1, rank last).
__global__ void ReduceKernel(const float* __restrict__ in_distances,
                             const int64_t* __restrict__ in_tokens,
                             const int64_t* __restrict__ in_offset,
                             const int64_t* __restrict__ out_offset, int num_queries, int kept,
                             bool descending, float pad, float* __restrict__ out_distances,
                             int64_t* __restrict__ out_tokens) {
  __shared__ typename BlockSort::TempStorage sort_storage;
  const int64_t chunk_begin = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int q = blockIdx.y; q < num_queries; q += gridDim.y) {
    const int64_t first = in_offset[q] + chunk_begin;
    const int64_t valid = min(static_cast<int64_t>(kTile), in_offset[q + 1] - first);
    if (valid <= 0) continue;  // block-uniform
    __syncthreads();           // the previous query's sort storage is no longer read
    uint64_t keys[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int offset = i * kThreads + threadIdx.x;
      keys[i] = kPadKey;
      if (offset < valid && in_tokens[first + offset] >= 0) {
        keys[i] = static_cast<uint64_t>(RankBits(in_distances[first + offset], descending))
                      << kTileBits |
                  offset;
      }
    }
    const int64_t out = out_offset[q] + blockIdx.x * static_cast<int64_t>(kept);
    KeepBest(sort_storage, keys, kept, descending, pad, in_tokens + first, out_distances + out,
             out_tokens + out);
  }
}

__global__ void GatherKernel(const float* __restrict__ distances,
                             const int64_t* __restrict__ tokens,
                             const int64_t* __restrict__ candidate_offset, int num_queries, int k,
                             float* __restrict__ out_distances, int64_t* __restrict__ out_ids) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(num_queries) * k) return;
  const int64_t q = i / k, j = i % k;
  const int64_t at = candidate_offset[q] + j;
  const bool kept = at < candidate_offset[q + 1];
  out_distances[i] = kept ? distances[at] : 0.0f;
  out_ids[i] = kept ? tokens[at] : -1;
}

// The stream-ordered pool keeps freed memory for the next call instead of returning it to the
// driver at every synchronisation (a cudaMalloc per call would cost more than a small scan).
void KeepPoolMemory() {
  static std::once_flag once;
  std::call_once(once, [] {
    int device = 0;
    cudaMemPool_t pool;
    if (cudaGetDevice(&device) != cudaSuccess) return;
    if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) return;
    uint64_t threshold = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  });
}

// Stable sort of every query's row by distance (descending for inner product).
cudaError_t SortRows(void* temp, size_t& temp_bytes, const float* keys_in, float* keys_out,
                     const int64_t* tokens_in, int64_t* tokens_out, int64_t n, int num_queries,
                     const int64_t* offsets, bool descending, cudaStream_t stream) {
  if (descending) {
    return cub::DeviceSegmentedSort::StableSortPairsDescending(
        temp, temp_bytes, keys_in, keys_out, tokens_in, tokens_out, n, num_queries, offsets,
        offsets + 1, stream);
  }
  return cub::DeviceSegmentedSort::StableSortPairs(temp, temp_bytes, keys_in, keys_out, tokens_in,
                                                   tokens_out, n, num_queries, offsets, offsets + 1,
                                                   stream);
}

// The tile kernel with the table in shared memory when it fits there (with the sort storage),
// else read from global memory.
cudaError_t LaunchTiles(const DeviceCodes& codes, const DeviceScan& scan, int64_t max_tiles,
                        bool descending, float pad, float* distances, int64_t* tokens,
                        cudaStream_t stream) {
  int device = 0, shared_limit = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  cudaFuncAttributes shared_lut_kernel;
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&shared_lut_kernel, TileKernel<true>);
  if (e != cudaSuccess) return e;
  const size_t lut_bytes = static_cast<size_t>(codes.m_count) * 256 * sizeof(float);
  const dim3 grid(static_cast<unsigned>(max_tiles), std::min(scan.num_queries, kMaxGridY));
  if (lut_bytes + shared_lut_kernel.sharedSizeBytes <= static_cast<size_t>(shared_limit)) {
    e = cudaFuncSetAttribute(TileKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(lut_bytes));
    if (e != cudaSuccess) return e;
    TileKernel<true><<<grid, kThreads, lut_bytes, stream>>>(codes.codes, scan, descending, pad,
                                                            distances, tokens);
  } else {
    TileKernel<false>
        <<<grid, kThreads, 0, stream>>>(codes.codes, scan, descending, pad, distances, tokens);
  }
  return cudaGetLastError();
}

// Page-locked host memory kept per thread between calls: copies from it are asynchronous and
// run at the link's speed (from pageable memory the driver stages them through its own buffer).
class PinnedStaging {
 public:
  ~PinnedStaging() { cudaFreeHost(data_); }

  // The buffer, at least `bytes` long; null on failure (`error` set).
  char* Reserve(size_t bytes, cudaError_t& error) {
    if (bytes > capacity_) {
      cudaFreeHost(data_);
      data_ = nullptr;
      capacity_ = 0;
      const size_t grown = std::max(bytes, 2 * capacity_);
      error = cudaMallocHost(reinterpret_cast<void**>(&data_), grown);
      if (error != cudaSuccess) return nullptr;
      capacity_ = grown;
    }
    return data_;
  }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

template <typename T>
void Put(char* staging, size_t at, const T* data, size_t count) {
  if (count > 0) std::memcpy(staging + at, data, count * sizeof(T));
}

// The largest count of candidates [offsets[q], offsets[q + 1]) of a query.
int64_t MostCandidates(const std::vector<int64_t>& offsets) {
  int64_t most = 0;
  for (size_t q = 0; q + 1 < offsets.size(); ++q)
    most = std::max(most, offsets[q + 1] - offsets[q]);
  return most;
}

// Candidate offsets of each selection level: level 0 the tiles' (per query, kept per tile of
// its positions), each next level one reduction pass over kTile-candidate chunks, until no
// query has more than kFinalSortLimit or a pass would not shrink them.
std::vector<std::vector<int64_t>> CandidateLevels(const SubsetScan& scan, int kept) {
  const int nq = scan.num_queries;
  std::vector<std::vector<int64_t>> levels(1, std::vector<int64_t>(nq + 1, 0));
  for (int q = 0; q < nq; ++q) {
    const int g = scan.query_group[q];
    const int64_t positions = scan.group_position[g + 1] - scan.group_position[g];
    const int64_t tiles = (positions + kTile - 1) / kTile;
    levels[0][q + 1] = levels[0][q] + tiles * kept;
  }
  while (MostCandidates(levels.back()) > kFinalSortLimit) {
    std::vector<int64_t> next(nq + 1, 0);
    const std::vector<int64_t>& last = levels.back();
    for (int q = 0; q < nq; ++q) {
      next[q + 1] = next[q] + (last[q + 1] - last[q] + kTile - 1) / kTile * kept;
    }
    if (MostCandidates(next) >= MostCandidates(last)) break;
    levels.push_back(std::move(next));
  }
  return levels;
}

}  // namespace

int DeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::string DeviceDescription() {
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    return "no CUDA device";
  }
  return std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
         std::to_string(prop.totalGlobalMem >> 30) + " GiB";
}

DeviceBuffer::~DeviceBuffer() { cudaFree(ptr_); }

std::string DeviceBuffer::Upload(const void* host, size_t bytes) {
  cudaFree(ptr_);
  ptr_ = nullptr;
  if (cudaError_t e = cudaMalloc(&ptr_, bytes); e != cudaSuccess) return ErrorText(e);
  return ErrorText(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
}

std::string SubsetAdcSearch(const DeviceCodes& codes, const SubsetScan& scan, float* distances,
                            int64_t* ids) {
  const int nq = scan.num_queries, k = scan.k;
  const bool descending = scan.inner_product;
  const float pad = descending ? -INFINITY : INFINITY;
  const int kept = std::min(k, kTile);
  const int64_t num_ranges = scan.num_ranges;
  const int64_t num_positions = scan.group_position[scan.num_groups];
  int64_t max_total = 0;
  for (int g = 0; g < scan.num_groups; ++g) {
    max_total = std::max(max_total, scan.group_position[g + 1] - scan.group_position[g]);
  }
  const std::vector<std::vector<int64_t>> levels = CandidateLevels(scan, kept);
  const int64_t n0 = levels[0][nq], n_last = levels.back()[nq];
  if (n0 == 0) {
    std::fill(ids, ids + static_cast<int64_t>(nq) * k, -1);
    return "";
  }
  KeepPoolMemory();
  const cudaStream_t stream = cudaStreamPerThread;

  // Host inputs, staged in the layout of the device buffer's first part.
  const size_t query_floats = static_cast<size_t>(nq) * codes.m_count * codes.dsub;
  Layout layout;
  const size_t at_queries = layout.Add<float>(query_floats);
  const size_t at_query_group = layout.Add<int32_t>(nq);
  const size_t at_group_position = layout.Add<int64_t>(scan.num_groups + 1);
  const size_t at_range_begin = layout.Add<int64_t>(num_ranges);
  const size_t at_range_start = layout.Add<int64_t>(num_ranges + 1);
  std::vector<size_t> at_levels;
  for (size_t l = 0; l < levels.size(); ++l) at_levels.push_back(layout.Add<int64_t>(nq + 1));
  const size_t input_bytes = layout.bytes();
  cudaError_t e = cudaSuccess;
  thread_local PinnedStaging pinned;
  char* staging = pinned.Reserve(input_bytes, e);
  if (staging == nullptr) return ErrorText(e);
  Put(staging, at_queries, scan.queries, query_floats);
  Put(staging, at_query_group, scan.query_group, nq);
  Put(staging, at_group_position, scan.group_position, scan.num_groups + 1);
  Put(staging, at_range_begin, scan.range_begin, num_ranges);
  Put(staging, at_range_start, scan.range_start, num_ranges + 1);
  for (size_t l = 0; l < levels.size(); ++l) Put(staging, at_levels[l], levels[l].data(), nq + 1);

  // Device-only buffers: tables, tokens of positions, two candidate buffers used in turn by the
  // levels (level 0 and even levels in the first), the final sort's output and scratch.
  const int64_t n1 = levels.size() > 1 ? levels[1][nq] : 0;
  size_t sort_bytes = 0;
  e = SortRows(nullptr, sort_bytes, nullptr, nullptr, nullptr, nullptr, n_last, nq, nullptr,
               descending, stream);
  if (e != cudaSuccess) return ErrorText(e);
  const size_t at_luts = layout.Add<float>(static_cast<size_t>(nq) * codes.m_count * 256);
  const size_t at_position_tokens = layout.Add<int64_t>(num_positions);
  const size_t at_distances[2] = {layout.Add<float>(n0), layout.Add<float>(n1)};
  const size_t at_tokens[2] = {layout.Add<int64_t>(n0), layout.Add<int64_t>(n1)};
  const size_t at_sorted_distances = layout.Add<float>(n_last);
  const size_t at_sorted_tokens = layout.Add<int64_t>(n_last);
  const size_t at_out_distances = layout.Add<float>(static_cast<size_t>(nq) * k);
  const size_t at_out_ids = layout.Add<int64_t>(static_cast<size_t>(nq) * k);
  const size_t at_sort = layout.Add<char>(sort_bytes);

  char* base = nullptr;
  e = cudaMallocAsync(reinterpret_cast<void**>(&base), layout.bytes(), stream);
  if (e != cudaSuccess) return ErrorText(e);
  e = cudaMemcpyAsync(base, staging, input_bytes, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) {
    ExpandPositionsKernel<<<static_cast<unsigned>((num_positions + kThreads - 1) / kThreads),
                            kThreads, 0, stream>>>(
        At<int64_t>(base, at_range_begin), At<int64_t>(base, at_range_start), num_ranges,
        num_positions, At<int64_t>(base, at_position_tokens));
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) {
    LutKernel<<<dim3(nq, codes.m_count), 256, 0, stream>>>(
        At<float>(base, at_queries), codes.centroids_t, codes.m_count, codes.dsub, !descending,
        At<float>(base, at_luts));
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) {
    const DeviceScan device_scan{codes.m_count,
                                 nq,
                                 At<float>(base, at_luts),
                                 kept,
                                 At<int64_t>(base, at_levels[0]),
                                 At<int32_t>(base, at_query_group),
                                 At<int64_t>(base, at_group_position),
                                 At<int64_t>(base, at_position_tokens)};
    e = LaunchTiles(codes, device_scan, (max_total + kTile - 1) / kTile, descending, pad,
                    At<float>(base, at_distances[0]), At<int64_t>(base, at_tokens[0]), stream);
  }
  for (size_t l = 1; l < levels.size() && e == cudaSuccess; ++l) {
    const int64_t max_chunks = (MostCandidates(levels[l - 1]) + kTile - 1) / kTile;
    const int from = (l - 1) % 2, to = l % 2;
    ReduceKernel<<<dim3(static_cast<unsigned>(max_chunks), std::min(nq, kMaxGridY)), kThreads, 0,
                   stream>>>(
        At<float>(base, at_distances[from]), At<int64_t>(base, at_tokens[from]),
        At<int64_t>(base, at_levels[l - 1]), At<int64_t>(base, at_levels[l]), nq, kept, descending,
        pad, At<float>(base, at_distances[to]), At<int64_t>(base, at_tokens[to]));
    e = cudaGetLastError();
  }
  const int last = (levels.size() - 1) % 2;
  const int64_t* last_offsets = At<int64_t>(base, at_levels.back());
  if (e == cudaSuccess) {
    e = SortRows(base + at_sort, sort_bytes, At<float>(base, at_distances[last]),
                 At<float>(base, at_sorted_distances), At<int64_t>(base, at_tokens[last]),
                 At<int64_t>(base, at_sorted_tokens), n_last, nq, last_offsets, descending, stream);
  }
  const int64_t outputs = static_cast<int64_t>(nq) * k;
  if (e == cudaSuccess) {
    GatherKernel<<<static_cast<unsigned>((outputs + kThreads - 1) / kThreads), kThreads, 0,
                   stream>>>(At<float>(base, at_sorted_distances),
                             At<int64_t>(base, at_sorted_tokens), last_offsets, nq, k,
                             At<float>(base, at_out_distances), At<int64_t>(base, at_out_ids));
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(distances, At<float>(base, at_out_distances), outputs * sizeof(float),
                        cudaMemcpyDeviceToHost, stream);
  }
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(ids, At<int64_t>(base, at_out_ids), outputs * sizeof(int64_t),
                        cudaMemcpyDeviceToHost, stream);
  }
  const cudaError_t freed = cudaFreeAsync(base, stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (e == cudaSuccess) e = freed;
  if (e == cudaSuccess) e = synced;
  return ErrorText(e);
}

}  // namespace knnserve::cuda
