// AVX2 kernels (this file alone is compiled with -mavx2 -mfma -ffp-contract=off): the exact
// scan, the quantized scan and the table kernels, for CPUs without AVX-512 VBMI.
//
// Exact scan: two 8-lane accumulators hold the 16 canonical partial sums (adc_kernels.h); the
// codes of a vector are widened to table indices once and reused by every query of the group.
//
// Quantized scan: without vpermi2b a 256-entry byte table does not fit a look-up instruction;
// vpshufb looks up 16 entries, so a code's entry is one of 16 vpshufb results, chosen by a tree
// of 15 blends on the code's high nibble (about 2 instructions per 32 codes and table row, where
// VBMI needs 2 per 64 codes and table). The packed blocks are the scalar kernel's.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/adc/adc_kernels.h"
#include "common/adc/simd_tables.h"

namespace knnserve::adc_internal {
namespace {

// Canonical tree: (j + 8) is lo + hi, then (j + 4), (j + 2), (j + 1).
inline float Reduce(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

}  // namespace

void ScanAvx2(const float* const* luts, int num_queries, const uint8_t* codes, int64_t n,
              int m_count, float* out) {
  const int chunks = (m_count + 15) / 16;
  const int rem = m_count % 16;  // sub-quantizers in a partial last chunk, 0 if none
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i index[2 * kMaxAdcM / 16];
  __m256i mask[2];  // lanes of the partial chunk that hold a sub-quantizer
  for (int h = 0; h < 2; ++h) {
    mask[h] = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem - 8 * h), lane);
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* code = codes + i * m_count;
    for (int c = 0; c < chunks; ++c) {
      alignas(16) uint8_t bytes[16] = {};
      const bool partial = rem != 0 && c == chunks - 1;
      std::memcpy(bytes, code + 16 * c, partial ? rem : 16);
      const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(bytes));
      for (int h = 0; h < 2; ++h) {
        const __m256i base = _mm256_add_epi32(
            lane, _mm256_set1_epi32(16 * c + 8 * h));  // sub-quantizer of each lane
        const __m128i b8 = h == 0 ? b : _mm_srli_si128(b, 8);
        index[2 * c + h] = _mm256_add_epi32(_mm256_slli_epi32(base, 8), _mm256_cvtepu8_epi32(b8));
      }
    }
    for (int q = 0; q < num_queries; ++q) {
      const float* lut = luts[q];
      __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int c = 0; c < chunks; ++c) {
        const bool partial = rem != 0 && c == chunks - 1;
        for (int h = 0; h < 2; ++h) {
          const __m256 v =
              partial ? _mm256_mask_i32gather_ps(_mm256_setzero_ps(), lut, index[2 * c + h],
                                                 _mm256_castsi256_ps(mask[h]), 4)
                      : _mm256_i32gather_ps(lut, index[2 * c + h], 4);
          acc[h] = _mm256_add_ps(acc[h], v);
        }
      }
      out[q * n + i] = Reduce(acc[0], acc[1]);
    }
  }
}

// ---- Table kernels: the same float operations per entry as their scalar twins ----------------

namespace {

struct Avx2Ops {
  using V = __m256;
  static constexpr int kWidth = 8;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};

}  // namespace

void LutAvx2(const float* query, const float* centroids_t, int m_count, int dsub, bool l2,
             float* lut) {
  LutSimd<Avx2Ops>(query, centroids_t, m_count, dsub, l2, lut);
}

void RowRangesAvx2(const float* lut, int m_count, float* lo, float* hi) {
  for (int m = 0; m < m_count; ++m) {
    const float* row = lut + m * 256;
    __m256 mn = _mm256_loadu_ps(row);
    __m256 mx = mn;
    for (int c = 8; c < 256; c += 8) {
      const __m256 x = _mm256_loadu_ps(row + c);
      mn = _mm256_min_ps(mn, x);
      mx = _mm256_max_ps(mx, x);
    }
    alignas(32) float l[8], h[8];
    _mm256_store_ps(l, mn);
    _mm256_store_ps(h, mx);
    lo[m] = *std::min_element(l, l + 8);
    hi[m] = *std::max_element(h, h + 8);
  }
}

void QuantizeRowsAvx2(const float* lut, int m_count, float sign, const float* mins, float inverse,
                      uint8_t* table) {
  const __m256 s = _mm256_set1_ps(sign);
  const __m256 inv = _mm256_set1_ps(inverse);
  const __m256 top = _mm256_set1_ps(255.0f);
  // The two packs interleave 128-bit lanes: dword p of their result holds entries of source
  // dword order[p].
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int m = 0; m < m_count; ++m) {
    const __m256 mn = _mm256_set1_ps(mins[m]);
    for (int c = 0; c < 256; c += 32) {
      __m256i v[4];
      for (int a = 0; a < 4; ++a) {
        const __m256 x = _mm256_loadu_ps(lut + m * 256 + c + 8 * a);
        // min(v, 255) returns 255 for NaN, as std::min(255.0f, v) does.
        v[a] = _mm256_cvttps_epi32(
            _mm256_min_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(s, x), mn), inv), top));
      }
      const __m256i bytes =
          _mm256_packus_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(table + m * 256 + c),
                          _mm256_permutevar8x32_epi32(bytes, order));
    }
  }
}

void ResidualLutsAvx2(const float* const* xs, int num, const float* centroids_t, const float* norms,
                      int m_count, int dsub, float* const* luts) {
  ResidualLutsSimd<Avx2Ops>(xs, num, centroids_t, norms, m_count, dsub, luts);
}

// ---- The quantized scan -------------------------------------------------------------------------
namespace {

// The table entries of 32 codes from rows [kFirst, kFirst + kRows) of a 256-entry byte table:
// vpshufb looks up 16-entry rows within each 128-bit lane, so the table is 16 rows (high nibble)
// indexed by the low nibble, and a tree of blends on code bits 4, 5, 6 and 7 picks each code's
// row. `select[b]` has code bit 4 + b in every byte's top bit (all vpblendvb reads). Depth first,
// so that few intermediate results are live: the whole look-up stays in registers.
template <int kFirst, int kRows>
inline __m256i LookUp32(const uint8_t* table, __m256i low_nibbles, const __m256i* select) {
  if constexpr (kRows == 1) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(
                                   reinterpret_cast<const __m128i*>(table + 16 * kFirst))),
                               low_nibbles);
  } else {
    constexpr int kHalf = kRows / 2;
    const __m256i lower = LookUp32<kFirst, kHalf>(table, low_nibbles, select);
    const __m256i upper = LookUp32<kFirst + kHalf, kHalf>(table, low_nibbles, select);
    return _mm256_blendv_epi8(lower, upper, select[__builtin_ctz(kHalf)]);
  }
}

// The block's sums for kQueries tables, sub-quantizer by sub-quantizer and 32 codes at a time:
// the codes' nibbles and selectors are computed once for all of them. 16-bit accumulators: even
// and odd vectors (the low and high byte of each word).
template <int kQueries>
void ScanBlock(const uint8_t* const* tables, const uint8_t* block, int m_count,
               const uint16_t* const* biases, const uint16_t* limits, uint16_t* sums,
               uint64_t* below) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i low_bytes = _mm256_set1_epi16(0x00FF);
  __m256i even[kQueries][2], odd[kQueries][2];
  for (int q = 0; q < kQueries; ++q) {
    for (int h = 0; h < 2; ++h) even[q][h] = odd[q][h] = _mm256_setzero_si256();
  }
  for (int m = 0; m < m_count; ++m) {
    for (int h = 0; h < 2; ++h) {
      const __m256i codes =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(block + m * kAdcBlock + 32 * h));
      const __m256i low_nibbles = _mm256_and_si256(codes, nibble);
      // A 16-bit shift left by 3 - b moves bit 4 + b of every byte to its top bit.
      const __m256i select[4] = {_mm256_slli_epi16(codes, 3), _mm256_slli_epi16(codes, 2),
                                 _mm256_slli_epi16(codes, 1), codes};
      for (int q = 0; q < kQueries; ++q) {
        const __m256i entries = LookUp32<0, 16>(tables[q] + m * 256, low_nibbles, select);
        even[q][h] = _mm256_add_epi16(even[q][h], _mm256_and_si256(entries, low_bytes));
        odd[q][h] = _mm256_add_epi16(odd[q][h], _mm256_srli_epi16(entries, 8));
      }
    }
  }
  for (int q = 0; q < kQueries; ++q) {
    // Word w of even/odd is vector 2w / 2w + 1 of its 32: unpack within 128-bit lanes, then
    // put the lanes in order.
    __m256i out[4];
    for (int h = 0; h < 2; ++h) {
      const __m256i lo = _mm256_unpacklo_epi16(even[q][h], odd[q][h]);
      const __m256i hi = _mm256_unpackhi_epi16(even[q][h], odd[q][h]);
      out[2 * h] = _mm256_permute2x128_si256(lo, hi, 0x20);
      out[2 * h + 1] = _mm256_permute2x128_si256(lo, hi, 0x31);
    }
    const __m256i limit = _mm256_set1_epi16(static_cast<int16_t>(limits[q]));
    __m256i within[4];
    for (int p = 0; p < 4; ++p) {
      if (biases != nullptr) {
        out[p] = _mm256_adds_epu16(
            out[p], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(biases[q] + 16 * p)));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + q * kAdcBlock + 16 * p), out[p]);
      within[p] = _mm256_cmpeq_epi16(_mm256_min_epu16(out[p], limit), out[p]);
    }
    // One bit per vector: pack the word masks to bytes (lanes interleave; permute them back).
    uint64_t bits = 0;
    for (int half = 0; half < 2; ++half) {
      const __m256i bytes = _mm256_permute4x64_epi64(
          _mm256_packs_epi16(within[2 * half], within[2 * half + 1]), 0xD8);
      bits |= uint64_t{static_cast<uint32_t>(_mm256_movemask_epi8(bytes))} << (32 * half);
    }
    below[q] = bits;
  }
}

}  // namespace

void ScanQuantizedAvx2(const uint8_t* const* tables, int num_queries, const uint8_t* block,
                       int m_count, const uint16_t* const* biases, const uint16_t* limits,
                       uint16_t* sums, uint64_t* below) {
  // Two queries per pass: their 8 accumulators stay in registers beside one look-up's tree.
  for (int first = 0; first < num_queries; first += 2) {
    const uint16_t* const* pass_biases = biases != nullptr ? biases + first : nullptr;
    if (num_queries - first >= 2) {
      ScanBlock<2>(tables + first, block, m_count, pass_biases, limits + first,
                   sums + first * kAdcBlock, below + first);
    } else {
      ScanBlock<1>(tables + first, block, m_count, pass_biases, limits + first,
                   sums + first * kAdcBlock, below + first);
    }
  }
}

}  // namespace knnserve::adc_internal
