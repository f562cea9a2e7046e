// AVX-512 VBMI kernels of the quantized two-stage ADC (this file alone is compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vbmi).
//
// Scan: the 256 one-byte entries of a sub-quantizer's table fill four registers; two vpermi2b
// look up 64 codes in entries 0..127 and 128..255 and bit 7 of each code picks between them, so
// one sub-quantizer of 64 vectors costs a handful of instructions instead of 64 gathered loads.
// The bytes are summed in two 16-bit accumulators (even and odd vectors).
//
// Pack: a byte transpose by a network of vpermi2b. Each register starts as V row pieces of W
// code bytes (V * W = 64); one vpermb makes it column-major, then every stage merges two
// registers of V rows x C columns into two of 2V rows x C/2 columns, until each register is one
// column (one sub-quantizer) of all 64 rows. A merge splits the columns in halves, so the first
// stage decides the most significant bit of a register's final column.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>

#include "common/adc/adc_kernels.h"

namespace knnserve::adc_internal {
namespace {

constexpr int kStages = 6;  // log2(kAdcBlock)

struct Permutations {
  // Row-major V x W pieces to column-major, for W = 8, 16, 32 (index log2(W) - 3).
  alignas(64) uint8_t to_columns[3][64];
  // Merging two registers of V rows (index log2(V)): the lower and upper half of the columns.
  alignas(64) uint8_t merge_lo[kStages][64];
  alignas(64) uint8_t merge_hi[kStages][64];
  // The scan's output words 0..31 and 32..63: word p is vector p, from the even (p even) or odd
  // accumulator's word p / 2.
  alignas(64) uint16_t interleave[2][32];

  Permutations() {
    for (int half = 0; half < 2; ++half) {
      for (int p = 0; p < 32; ++p) interleave[half][p] = (p & 1 ? 32 : 0) + 16 * half + p / 2;
    }
    for (int w = 8, x = 0; w <= 32; w *= 2, ++x) {
      const int v_count = kAdcBlock / w;
      for (int m = 0; m < w; ++m) {
        for (int v = 0; v < v_count; ++v) to_columns[x][m * v_count + v] = v * w + m;
      }
    }
    for (int v_count = 1, x = 0; v_count <= 32; v_count *= 2, ++x) {
      const int half = kAdcBlock / v_count / 2;  // columns of each output register
      for (int m = 0; m < half; ++m) {
        for (int v = 0; v < 2 * v_count; ++v) {
          auto source = [&](int column) {
            return v < v_count ? column * v_count + v : 64 + column * v_count + v - v_count;
          };
          merge_lo[x][m * 2 * v_count + v] = source(m);
          merge_hi[x][m * 2 * v_count + v] = source(m + half);
        }
      }
    }
  }
};

const Permutations& Perms() {
  static const Permutations perms;
  return perms;
}

inline __m512i Load(const uint8_t* p) { return _mm512_load_si512(p); }

// Rows [first, first + 64 / width) of rows, bytes [column, column + width) of each.
inline __m512i LoadPieces(const uint8_t* const* rows, int first, int width, int column) {
  switch (width) {
    case 64:
      return _mm512_loadu_si512(rows[first] + column);
    case 32:
      return _mm512_inserti64x4(
          _mm512_castsi256_si512(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[first] + column))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[first + 1] + column)), 1);
    case 16: {
      __m512i r = _mm512_castsi128_si512(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[first] + column)));
      r = _mm512_inserti32x4(
          r, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[first + 1] + column)), 1);
      r = _mm512_inserti32x4(
          r, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[first + 2] + column)), 2);
      return _mm512_inserti32x4(
          r, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[first + 3] + column)), 3);
    }
    default: {  // 8
      alignas(64) uint64_t pieces[8];
      for (int i = 0; i < 8; ++i) std::memcpy(&pieces[i], rows[first + i] + column, 8);
      return _mm512_load_si512(pieces);
    }
  }
}

// Runs kStages merge stages on 2^kStages registers of v rows each, r[cb * row_blocks + rb] (row
// block rb, column block cb; row_blocks = 2^kStages at the start, 1 at the end). Compile-time
// sizes let the compiler keep the group in registers: 16 + 16 of the 32 zmm registers at most.
template <int kStages>
inline void Merge(__m512i* r, int v, const Permutations& perms) {
  constexpr int kRegs = 1 << kStages;
#pragma GCC unroll 4
  for (int s = 0; s < kStages; ++s, v *= 2) {
    const int x = __builtin_ctz(v);
    const __m512i lo = Load(perms.merge_lo[x]);
    const __m512i hi = Load(perms.merge_hi[x]);
    const int half = (kRegs >> s) / 2;
    __m512i out[kRegs];
#pragma GCC unroll 16
    for (int j = 0; j < kRegs / 2; ++j) {
      const int cb = j / half;
      const int i = j % half;
      const __m512i top = r[cb * 2 * half + 2 * i];
      const __m512i bottom = r[cb * 2 * half + 2 * i + 1];
      out[2 * cb * half + i] = _mm512_permutex2var_epi8(top, lo, bottom);
      out[(2 * cb + 1) * half + i] = _mm512_permutex2var_epi8(top, hi, bottom);
    }
#pragma GCC unroll 16
    for (int j = 0; j < kRegs; ++j) r[j] = out[j];
  }
}

void MergeStages(int stages, __m512i* r, int v, const Permutations& perms) {
  switch (stages) {
    case 1:
      return Merge<1>(r, v, perms);
    case 2:
      return Merge<2>(r, v, perms);
    case 3:
      return Merge<3>(r, v, perms);
    default:
      return Merge<4>(r, v, perms);
  }
}

// Transposes the slab of columns [column, column + width) of the 64 rows into block. The
// log2(width) stages run in two phases so that each works on a register-sized group: first up
// to 4 stages on groups of consecutive row blocks, then the rest on registers that hold the same
// columns of different groups.
void PackSlab(const uint8_t* const* rows, int width, int column, uint8_t* block) {
  const Permutations& perms = Perms();
  const int v0 = kAdcBlock / width;
  const int stages = __builtin_ctz(width);
  const int first = std::min(stages, 4);
  const int second = stages - first;
  const int group = 1 << first;
  const __m512i to_columns =
      width < 64 ? Load(perms.to_columns[__builtin_ctz(width) - 3]) : _mm512_setzero_si512();
  __m512i middle[kAdcBlock];  // [g * group + c]: columns c of group g's rows
  for (int g = 0; g < width / group; ++g) {
    __m512i* r = middle + g * group;
    for (int j = 0; j < group; ++j) {
      r[j] = LoadPieces(rows, (g * group + j) * v0, width, column);
      if (width < 64) r[j] = _mm512_permutexvar_epi8(to_columns, r[j]);
    }
    MergeStages(first, r, v0, perms);
  }
  if (second == 0) {
    for (int c = 0; c < width; ++c) _mm512_store_si512(block + (column + c) * kAdcBlock, middle[c]);
    return;
  }
  const int groups = 1 << second;
  for (int c = 0; c < group; ++c) {
    __m512i r[4];
    for (int g = 0; g < groups; ++g) r[g] = middle[g * group + c];
    MergeStages(second, r, v0 << first, perms);
    for (int c2 = 0; c2 < groups; ++c2) {
      _mm512_store_si512(block + (column + c * groups + c2) * kAdcBlock, r[c2]);
    }
  }
}

}  // namespace

void PackVbmi(const uint8_t* const* rows, int m_count, uint8_t* block) {
  // The widest power-of-two slab that divides m_count; below 8 bytes the scalar loop is as good.
  const int width = std::min(64, m_count & -m_count);
  if (width < 8) {
    PackScalar(rows, m_count, block);
    return;
  }
  for (int column = 0; column < m_count; column += width) PackSlab(rows, width, column, block);
}

namespace {

// The block's integer sums for kQueries tables, sub-quantizer by sub-quantizer: a line of codes
// and its half-select mask are loaded once for all queries, whose accumulators stay in registers
// (2 per query, 16 at most).
template <int kQueries>
void ScanBlock(const uint8_t* const* tables, const uint8_t* block, int m_count,
               const uint16_t* const* biases, const uint16_t* limits, uint16_t* sums,
               uint64_t* below) {
  const __m512i low_bytes = _mm512_set1_epi16(0x00FF);
  __m512i even[kQueries], odd[kQueries];
  // Unrolled, so that the accumulators are registers, not a stack array.
#pragma GCC unroll 8
  for (int q = 0; q < kQueries; ++q) even[q] = odd[q] = _mm512_setzero_si512();
  for (int m = 0; m < m_count; ++m) {
    const __m512i codes = Load(block + m * kAdcBlock);
    const __mmask64 high_half = _mm512_movepi8_mask(codes);
#pragma GCC unroll 8
    for (int q = 0; q < kQueries; ++q) {
      const uint8_t* table = tables[q] + m * 256;
      const __m512i low = _mm512_permutex2var_epi8(_mm512_loadu_si512(table), codes,
                                                   _mm512_loadu_si512(table + 64));
      const __m512i high = _mm512_permutex2var_epi8(_mm512_loadu_si512(table + 128), codes,
                                                    _mm512_loadu_si512(table + 192));
      const __m512i entries = _mm512_mask_blend_epi8(high_half, low, high);
      even[q] = _mm512_add_epi16(even[q], _mm512_and_si512(entries, low_bytes));
      odd[q] = _mm512_add_epi16(odd[q], _mm512_srli_epi16(entries, 8));
    }
  }
  const Permutations& perms = Perms();
  const __m512i interleave_first = _mm512_load_si512(perms.interleave[0]);
  const __m512i interleave_second = _mm512_load_si512(perms.interleave[1]);
#pragma GCC unroll 8
  for (int q = 0; q < kQueries; ++q) {
    __m512i first = _mm512_permutex2var_epi16(even[q], interleave_first, odd[q]);
    __m512i second = _mm512_permutex2var_epi16(even[q], interleave_second, odd[q]);
    if (biases != nullptr) {
      first = _mm512_adds_epu16(first, _mm512_loadu_si512(biases[q]));
      second = _mm512_adds_epu16(second, _mm512_loadu_si512(biases[q] + 32));
    }
    _mm512_storeu_si512(sums + q * kAdcBlock, first);
    _mm512_storeu_si512(sums + q * kAdcBlock + 32, second);
    const __m512i limit = _mm512_set1_epi16(static_cast<int16_t>(limits[q]));
    below[q] = static_cast<uint64_t>(_mm512_cmple_epu16_mask(first, limit)) |
               static_cast<uint64_t>(_mm512_cmple_epu16_mask(second, limit)) << 32;
  }
}

using ScanBlockFn = void (*)(const uint8_t* const*, const uint8_t*, int, const uint16_t* const*,
                             const uint16_t*, uint16_t*, uint64_t*);
constexpr ScanBlockFn kScanBlock[] = {ScanBlock<1>, ScanBlock<2>, ScanBlock<3>, ScanBlock<4>,
                                      ScanBlock<5>, ScanBlock<6>, ScanBlock<7>, ScanBlock<8>};

}  // namespace

void ScanQuantizedVbmi(const uint8_t* const* tables, int num_queries, const uint8_t* block,
                       int m_count, const uint16_t* const* biases, const uint16_t* limits,
                       uint16_t* sums, uint64_t* below) {
  // Up to 8 queries per pass (their 16 accumulators fill half the registers).
  constexpr int kMaxQueries = static_cast<int>(std::size(kScanBlock));
  for (int first = 0; first < num_queries; first += kMaxQueries) {
    const int count = std::min(kMaxQueries, num_queries - first);
    kScanBlock[count - 1](tables + first, block, m_count,
                          biases != nullptr ? biases + first : nullptr, limits + first,
                          sums + first * kAdcBlock, below + first);
  }
}

}  // namespace knnserve::adc_internal
