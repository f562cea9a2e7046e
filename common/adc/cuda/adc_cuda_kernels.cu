// CUDA subset ADC (see adc_cuda_kernels.h).
//
// One call is four kernels on the calling thread's per-thread stream:
//  0. tables: one block per (query, sub-quantizer), one thread per centroid, LutScalar's
//     operations in its order (__fsub_rn/__fmul_rn/__fadd_rn: never contracted to an FMA);
//  1. tiles: a block per (tile of kTile positions, query); the block first copies its query's
//     table to shared memory (64 KiB at m = 64), then each thread finds the tokens of its
//     positions by binary search over the group's range prefixes and sums the table entries of
//     each token's code in the CPU's canonical order (__fadd_rn: no contraction, so the sums
//     equal the CPU's); the block sorts its tile by (distance, position) in shared memory and
//     writes only its best min(k, kTile) as candidates;
//  2. one stable segmented radix sort of each query's candidates (CUB): candidates are laid out
//     in position order, so ties keep ascending tokens;
//  3. a gather of each query's first k into the q x k answer.
// Only the candidates (k per 2048 positions) reach global memory and the device-wide sort.
// The host inputs travel in one copy and every device buffer of the call is carved from one
// stream-ordered allocation, so a call costs one allocation, one copy each way and one sync.
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

std::string ErrorText(cudaError_t e) { return e == cudaSuccess ? "" : cudaGetErrorString(e); }

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Consecutive aligned slices of one buffer: Add() reserves, then Bind() hands out pointers into
// the buffer in the same order.
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

// Device copies of SubsetScan's arrays, plus each query's row offset in the sort buffers.
struct DeviceScan {
  int m_count;
  int num_queries;
  const float* luts;                // num_queries x m_count x 256, written by LutKernel
  int kept_per_tile;                // min(k, kTile)
  const int64_t* candidate_offset;  // num_queries + 1: query q's candidates in [off[q], off[q+1])
  const int32_t* query_group;
  const int64_t* group_first_range;
  const int64_t* group_total;
  const int64_t* range_begin;
  const int64_t* range_prefix;
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

// Positions per block: a block reads its query's table (m KiB) once for kTile codes (kTile * m
// bytes), so the table costs an eighth of the code traffic.
constexpr int kItems = 8;
constexpr int kTile = kItems * kThreads;
constexpr int kTileBits = 11;  // kTile == 1 << kTileBits
static_assert(kTile == 1 << kTileBits);
// Sort keys are (ordered distance bits) << kTileBits | position in the tile; a key with every
// bit of that range set pads a tile's missing positions (no finite distance orders that high).
constexpr int kKeyBits = 32 + kTileBits;
constexpr uint64_t kPadKey = (uint64_t{1} << kKeyBits) - 1;

// The local token at position p of group g: the group's last range starting at or before p.
__device__ int64_t TokenAt(const DeviceScan& scan, int g, int64_t p) {
  int64_t lo = scan.group_first_range[g], hi = scan.group_first_range[g + 1] - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (scan.range_prefix[mid] <= p) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return scan.range_begin[lo] + (p - scan.range_prefix[lo]);
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

// Block (x, y) scores positions [x * kTile, (x + 1) * kTile) for queries y, y + gridDim.y, ...
// and writes each query's best kept_per_tile of them (ties by position) to its candidates
// [candidate_offset[q] + x * kept_per_tile, + kept_per_tile): distance and local token, or
// distance `pad` and token -1 past the group's last position.
// kSharedLut: the query's table is staged in dynamic shared memory (else read from global
// memory, for tables larger than a block's shared memory).
template <bool kSharedLut>
__global__ void TileKernel(const uint8_t* __restrict__ codes, DeviceScan scan, bool descending,
                           float pad, float* __restrict__ distances, int64_t* __restrict__ tokens) {
  using BlockSort = cub::BlockRadixSort<uint64_t, kThreads, kItems>;
  __shared__ typename BlockSort::TempStorage sort_storage;
  extern __shared__ float shared_lut[];
  const int64_t tile_begin = static_cast<int64_t>(blockIdx.x) * kTile;
  const int lut_floats = scan.m_count * 256;
  for (int q = blockIdx.y; q < scan.num_queries; q += gridDim.y) {
    const int g = scan.query_group[q];
    const int64_t total = scan.group_total[g];
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
        const int64_t token = TokenAt(scan, g, tile_begin + offset);
        const float d = CodeDistance(lut, codes + token * scan.m_count, scan.m_count);
        keys[i] = static_cast<uint64_t>(RankBits(d, descending)) << kTileBits | offset;
      }
    }
    // Keys are distinct (the position is in them), so the order is exactly (rank, position).
    BlockSort(sort_storage).Sort(keys, 0, kKeyBits);
    float* out_distances = distances + scan.candidate_offset[q] +
                           blockIdx.x * static_cast<int64_t>(scan.kept_per_tile);
    int64_t* out_tokens =
        tokens + scan.candidate_offset[q] + blockIdx.x * static_cast<int64_t>(scan.kept_per_tile);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int rank = threadIdx.x * kItems + i;  // blocked after the sort
      if (rank >= scan.kept_per_tile) continue;
      if (keys[i] == kPadKey) {
        out_distances[rank] = pad;
        out_tokens[rank] = -1;
      } else {
        const int offset = static_cast<int>(keys[i] & (kTile - 1));
        out_distances[rank] =
            RankedDistance(static_cast<uint32_t>(keys[i] >> kTileBits), descending);
        out_tokens[rank] = TokenAt(scan, g, tile_begin + offset);
      }
    }
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

template <typename T>
T* At(char* base, size_t at) {
  return reinterpret_cast<T*>(base + at);
}

template <typename T>
void Append(std::vector<char>& staging, size_t at, const T* data, size_t count) {
  if (count > 0) std::memcpy(staging.data() + at, data, count * sizeof(T));
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
  const int64_t num_ranges = scan.group_first_range[scan.num_groups];
  const int kept_per_tile = std::min(k, kTile);
  std::vector<int64_t> candidate_offset(nq + 1, 0);
  int64_t max_tiles = 0;
  for (int q = 0; q < nq; ++q) {
    const int64_t tiles = (scan.group_total[scan.query_group[q]] + kTile - 1) / kTile;
    candidate_offset[q + 1] = candidate_offset[q] + tiles * kept_per_tile;
    max_tiles = std::max(max_tiles, tiles);
  }
  const int64_t n = candidate_offset[nq];
  if (n == 0) {
    std::fill(ids, ids + static_cast<int64_t>(nq) * k, -1);
    return "";
  }
  KeepPoolMemory();
  const cudaStream_t stream = cudaStreamPerThread;

  // Host inputs, staged in the layout of the device buffer's first part.
  const int dim = codes.m_count * codes.dsub;
  const size_t query_floats = static_cast<size_t>(nq) * dim;
  Layout in;
  const size_t at_queries = in.Add<float>(query_floats);
  const size_t at_candidates = in.Add<int64_t>(nq + 1);
  const size_t at_query_group = in.Add<int32_t>(nq);
  const size_t at_first_range = in.Add<int64_t>(scan.num_groups + 1);
  const size_t at_group_total = in.Add<int64_t>(scan.num_groups);
  const size_t at_range_begin = in.Add<int64_t>(num_ranges);
  const size_t at_range_prefix = in.Add<int64_t>(num_ranges);
  std::vector<char> staging(in.bytes());
  Append(staging, at_queries, scan.queries, query_floats);
  Append(staging, at_candidates, candidate_offset.data(), nq + 1);
  Append(staging, at_query_group, scan.query_group, nq);
  Append(staging, at_first_range, scan.group_first_range, scan.num_groups + 1);
  Append(staging, at_group_total, scan.group_total, scan.num_groups);
  Append(staging, at_range_begin, scan.range_begin, num_ranges);
  Append(staging, at_range_prefix, scan.range_prefix, num_ranges);

  size_t sort_bytes = 0;
  if (cudaError_t e = SortRows(nullptr, sort_bytes, nullptr, nullptr, nullptr, nullptr, n, nq,
                               nullptr, scan.inner_product, stream);
      e != cudaSuccess) {
    return ErrorText(e);
  }
  Layout all = in;
  const size_t at_luts = all.Add<float>(static_cast<size_t>(nq) * codes.m_count * 256);
  const size_t at_keys = all.Add<float>(n), at_sorted_keys = all.Add<float>(n);
  const size_t at_tokens = all.Add<int64_t>(n), at_sorted_tokens = all.Add<int64_t>(n);
  const size_t at_out_distances = all.Add<float>(static_cast<size_t>(nq) * k);
  const size_t at_out_ids = all.Add<int64_t>(static_cast<size_t>(nq) * k);
  const size_t at_sort = all.Add<char>(sort_bytes);

  char* base = nullptr;
  if (cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&base), all.bytes(), stream);
      e != cudaSuccess) {
    return ErrorText(e);
  }
  float* keys = At<float>(base, at_keys);
  float* sorted_keys = At<float>(base, at_sorted_keys);
  int64_t* tokens = At<int64_t>(base, at_tokens);
  int64_t* sorted_tokens = At<int64_t>(base, at_sorted_tokens);
  float* out_distances = At<float>(base, at_out_distances);
  int64_t* out_ids = At<int64_t>(base, at_out_ids);
  const int64_t* candidates = At<int64_t>(base, at_candidates);
  const DeviceScan device_scan{codes.m_count,
                               nq,
                               At<float>(base, at_luts),
                               kept_per_tile,
                               candidates,
                               At<int32_t>(base, at_query_group),
                               At<int64_t>(base, at_first_range),
                               At<int64_t>(base, at_group_total),
                               At<int64_t>(base, at_range_begin),
                               At<int64_t>(base, at_range_prefix)};

  cudaError_t e =
      cudaMemcpyAsync(base, staging.data(), staging.size(), cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) {
    LutKernel<<<dim3(nq, codes.m_count), 256, 0, stream>>>(
        At<float>(base, at_queries), codes.centroids_t, codes.m_count, codes.dsub,
        !scan.inner_product, At<float>(base, at_luts));
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) {
    int device_id = 0, shared_limit = 0;
    e = cudaGetDevice(&device_id);
    if (e == cudaSuccess) {
      e = cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_id);
    }
    const size_t lut_bytes = static_cast<size_t>(codes.m_count) * 256 * sizeof(float);
    const dim3 grid(static_cast<unsigned>(max_tiles), std::min(nq, kMaxGridY));
    const bool descending = scan.inner_product;
    const float pad = descending ? -INFINITY : INFINITY;
    cudaFuncAttributes shared_lut_kernel;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&shared_lut_kernel, TileKernel<true>);
    if (e == cudaSuccess &&
        lut_bytes + shared_lut_kernel.sharedSizeBytes <= static_cast<size_t>(shared_limit)) {
      e = cudaFuncSetAttribute(TileKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(lut_bytes));
      if (e == cudaSuccess) {
        TileKernel<true><<<grid, kThreads, lut_bytes, stream>>>(codes.codes, device_scan,
                                                                descending, pad, keys, tokens);
        e = cudaGetLastError();
      }
    } else if (e == cudaSuccess) {
      TileKernel<false>
          <<<grid, kThreads, 0, stream>>>(codes.codes, device_scan, descending, pad, keys, tokens);
      e = cudaGetLastError();
    }
  }
  if (e == cudaSuccess) {
    e = SortRows(base + at_sort, sort_bytes, keys, sorted_keys, tokens, sorted_tokens, n, nq,
                 candidates, scan.inner_product, stream);
  }
  if (e == cudaSuccess) {
    const int64_t outputs = static_cast<int64_t>(nq) * k;
    GatherKernel<<<static_cast<unsigned>((outputs + kThreads - 1) / kThreads), kThreads, 0,
                   stream>>>(sorted_keys, sorted_tokens, candidates, nq, k, out_distances, out_ids);
    e = cudaGetLastError();
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(distances, out_distances, outputs * sizeof(float), cudaMemcpyDeviceToHost,
                          stream);
    }
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(ids, out_ids, outputs * sizeof(int64_t), cudaMemcpyDeviceToHost, stream);
    }
  }
  const cudaError_t freed = cudaFreeAsync(base, stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (e == cudaSuccess) e = freed;
  if (e == cudaSuccess) e = synced;
  return ErrorText(e);
}

}  // namespace knnserve::cuda
