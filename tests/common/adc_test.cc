#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/adc/adc_kernels.h"
#include "common/adc/ivf_adc.h"
#include "common/adc/subset_adc.h"
#include "common/adc/two_stage.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "faiss/IndexPQ.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve {
namespace {

using ::knnserve::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr AdcKernel kAllKernels[] = {AdcKernel::kScalar,        AdcKernel::kAvx2,
                                     AdcKernel::kAvx512,        AdcKernel::kQuantizedScalar,
                                     AdcKernel::kQuantizedAvx2, AdcKernel::kQuantizedVbmi};
constexpr AdcKernel kQuantizedKernels[] = {AdcKernel::kQuantizedScalar, AdcKernel::kQuantizedAvx2,
                                           AdcKernel::kQuantizedVbmi};
// The exact scalar reference and every quantized kernel.
constexpr AdcKernel kScalarAndQuantizedKernels[] = {AdcKernel::kScalar, AdcKernel::kQuantizedScalar,
                                                    AdcKernel::kQuantizedAvx2,
                                                    AdcKernel::kQuantizedVbmi};

// Every kernel this CPU supports must give bit-identical sums to the scalar reference, for M a
// multiple of 16 and not (partial last chunk), several queries sharing the codes.
TEST(AdcKernels, SimdEqualsScalarBitForBit) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> uni(-3.0f, 50.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int m : {1, 4, 8, 15, 16, 20, 32, 64, 100, 256}) {
    SCOPED_TRACE(m);
    constexpr int kQueries = 3;
    constexpr int64_t kN = 131;
    std::vector<float> luts(kQueries * m * 256);
    for (float& x : luts) x = uni(rng);
    std::vector<uint8_t> codes(kN * m);
    for (uint8_t& c : codes) c = static_cast<uint8_t>(byte(rng));
    const float* ptrs[kQueries];
    for (int q = 0; q < kQueries; ++q) ptrs[q] = luts.data() + q * m * 256;
    std::vector<float> want(kQueries * kN);
    GetAdcScan(AdcKernel::kScalar)(ptrs, kQueries, codes.data(), kN, m, want.data());
    for (AdcKernel kernel : {AdcKernel::kAvx2, AdcKernel::kAvx512}) {
      if (!CpuSupports(kernel)) {
        GTEST_LOG_(INFO) << AdcKernelName(kernel) << " not supported here; skipped";
        continue;
      }
      std::vector<float> got(kQueries * kN);
      GetAdcScan(kernel)(ptrs, kQueries, codes.data(), kN, m, got.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << AdcKernelName(kernel);
    }
  }
}

// The AVX2 and VBMI packs and quantized scans equal their scalar twins byte for byte: rows from
// scattered memory, M with every slab width the VBMI packer uses (8..64 bytes and the scalar
// fallback), sums near the 16-bit ceiling, limits that split the lanes.
void ExpectQuantizedEqualsScalar(AdcKernel kernel) {
  const QuantizedAdcKernels scalar = GetQuantizedKernels(AdcKernel::kQuantizedScalar);
  const QuantizedAdcKernels simd = GetQuantizedKernels(kernel);
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int m : {1, 4, 8, 12, 15, 16, 24, 32, 48, 64, 96, 100, 128, 256}) {
    SCOPED_TRACE(m);
    // Up to 9 queries per call: the kernel scans 8 at a time, so 9 takes a second pass.
    constexpr int kQueries = 9;
    std::vector<uint8_t> memory(200 * m);
    for (uint8_t& c : memory) c = static_cast<uint8_t>(byte(rng));
    const uint8_t* rows[kAdcBlock];
    for (int i = 0; i < kAdcBlock; ++i) rows[i] = memory.data() + (rng() % 200) * m;
    std::vector<uint8_t> tables(kQueries * m * 256);
    for (uint8_t& t : tables) t = static_cast<uint8_t>(byte(rng));
    std::fill(tables.begin(), tables.begin() + m * 256, uint8_t{255});  // the largest sums
    const uint8_t* table_ptrs[kQueries];
    for (int q = 0; q < kQueries; ++q) table_ptrs[q] = tables.data() + q * m * 256;
    // Per query, in turn: no limit, half the largest sum, 0. Biases: none, small ones, and ones
    // that saturate the sums.
    uint16_t limits[kQueries];
    std::vector<uint16_t> bias_values(kQueries * kAdcBlock);
    for (int q = 0; q < kQueries; ++q) {
      limits[q] = q % 3 == 0 ? 65535 : q % 3 == 1 ? static_cast<uint16_t>(m * 128) : 0;
      for (int i = 0; i < kAdcBlock; ++i) {
        bias_values[q * kAdcBlock + i] =
            q % 3 == 0 ? 0
                       : static_cast<uint16_t>(q % 3 == 1 ? rng() % 2000 : 65535 - rng() % 40000);
      }
    }
    const uint16_t* bias_ptrs[kQueries];
    for (int q = 0; q < kQueries; ++q) bias_ptrs[q] = bias_values.data() + q * kAdcBlock;

    struct Out {
      std::vector<uint8_t> block;
      uint16_t sums[kQueries * kAdcBlock];
      uint64_t below[kQueries];
      uint16_t biased_sums[kQueries * kAdcBlock];
      uint64_t biased_below[kQueries];
    };
    auto run = [&](const QuantizedAdcKernels& kernels, int queries, Out& out) {
      alignas(64) static uint8_t block[kMaxAdcM * kAdcBlock];
      kernels.pack(rows, m, block);
      out.block.assign(block, block + m * kAdcBlock);
      kernels.scan(table_ptrs, queries, block, m, nullptr, limits, out.sums, out.below);
      kernels.scan(table_ptrs, queries, block, m, bias_ptrs, limits, out.biased_sums,
                   out.biased_below);
    };
    for (int queries = 1; queries <= kQueries; ++queries) {
      SCOPED_TRACE(absl::StrCat(queries, " queries"));
      Out want, got;
      run(scalar, queries, want);
      run(simd, queries, got);
      EXPECT_EQ(got.block, want.block);
      const size_t sums_bytes = queries * kAdcBlock * sizeof(uint16_t);
      const size_t below_bytes = queries * sizeof(uint64_t);
      EXPECT_EQ(std::memcmp(got.sums, want.sums, sums_bytes), 0);
      EXPECT_EQ(std::memcmp(got.below, want.below, below_bytes), 0);
      EXPECT_EQ(std::memcmp(got.biased_sums, want.biased_sums, sums_bytes), 0);
      EXPECT_EQ(std::memcmp(got.biased_below, want.biased_below, below_bytes), 0);
      // Biases add to the sums, saturating at 65535.
      for (int i = 0; i < queries * kAdcBlock; ++i) {
        EXPECT_EQ(want.biased_sums[i], std::min(65535, want.sums[i] + bias_values[i])) << i;
      }
      // The scalar pack is the definition: block[m][i] = rows[i][m].
      for (int i = 0; i < kAdcBlock; ++i)
        EXPECT_EQ(want.block[(m - 1) * kAdcBlock + i], rows[i][m - 1]);
      EXPECT_EQ(want.sums[5], 255 * m);
      EXPECT_EQ(want.below[0], ~uint64_t{0});
    }
  }
}

// KNNSERVE_ISA caps the kernels as if the CPU had no more (each check runs in a fresh process:
// the level is read once per process).
TEST(AdcKernelsDeathTest, IsaCapLimitsTheKernels) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("KNNSERVE_ISA", "avx2", 1);
        const AdcKernel want =
            CpuSupports(AdcKernel::kAvx2) ? AdcKernel::kQuantizedAvx2 : AdcKernel::kQuantizedScalar;
        std::exit(!CpuSupports(AdcKernel::kAvx512) && BestAdcKernel() == want ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv("KNNSERVE_ISA", "scalar", 1);
        std::exit(BestAdcKernel() == AdcKernel::kQuantizedScalar &&
                          BestExactAdcKernel() == AdcKernel::kScalar
                      ? 0
                      : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_DEATH(
      {
        setenv("KNNSERVE_ISA", "avx3", 1);
        CpuSupports(AdcKernel::kScalar);
      },
      "KNNSERVE_ISA=avx3 is not one of scalar, avx2, avx512, avx512vbmi");
}

TEST(AdcKernels, QuantizedAvx2EqualsScalar) {
  if (!CpuSupports(AdcKernel::kQuantizedAvx2)) GTEST_SKIP() << "no AVX2 here";
  ExpectQuantizedEqualsScalar(AdcKernel::kQuantizedAvx2);
}

TEST(AdcKernels, QuantizedVbmiEqualsScalar) {
  if (!CpuSupports(AdcKernel::kQuantizedVbmi)) GTEST_SKIP() << "no AVX-512 VBMI here";
  ExpectQuantizedEqualsScalar(AdcKernel::kQuantizedVbmi);
}

// The table kernels of one instruction set, and the level they need.
struct TableKernels {
  const char* name;
  AdcKernel level;
  AdcLutFn lut;
  AdcTableKernels tables;
};
const TableKernels kSimdTableKernels[] = {
    {"avx2",
     AdcKernel::kAvx2,
     adc_internal::LutAvx2,
     {adc_internal::RowRangesAvx2, adc_internal::QuantizeRowsAvx2, adc_internal::ResidualLutsAvx2}},
    {"avx512",
     AdcKernel::kAvx512,
     adc_internal::LutAvx512,
     {adc_internal::RowRangesAvx512, adc_internal::QuantizeRowsAvx512,
      adc_internal::ResidualLutsAvx512}}};

// The SIMD table builders give the scalar one's tables bit for bit (both metrics, several
// sub-vector sizes), so the choice of builder never changes a distance.
TEST(AdcKernels, SimdLutsEqualScalarBitForBit) {
  std::mt19937_64 rng(29);
  std::normal_distribution<float> normal;
  for (int dsub : {1, 2, 3, 8, 16}) {
    constexpr int kM = 12;
    std::vector<float> centroids_t(kM * dsub * 256), query(kM * dsub);
    for (float& c : centroids_t) c = 3 * normal(rng);
    for (float& x : query) x = 3 * normal(rng);
    for (bool l2 : {true, false}) {
      std::vector<float> want(kM * 256);
      adc_internal::LutScalar(query.data(), centroids_t.data(), kM, dsub, l2, want.data());
      for (const TableKernels& simd : kSimdTableKernels) {
        if (!CpuSupports(simd.level)) continue;
        std::vector<float> got(kM * 256);
        simd.lut(query.data(), centroids_t.data(), kM, dsub, l2, got.data());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
            << simd.name << " dsub " << dsub << (l2 ? " l2" : " ip");
      }
    }
  }
}

// The residual tables (the query tables of IvfAdc), several at a time: every SIMD builder
// equals the scalar one bit for bit.
TEST(AdcKernels, SimdResidualTablesEqualScalarBitForBit) {
  std::mt19937_64 rng(31);
  std::normal_distribution<float> normal;
  for (int dsub : {1, 4, 8}) {
    for (int m : {8, 20, 32, 64}) {
      SCOPED_TRACE(absl::StrCat("m ", m, " dsub ", dsub));
      PqCodebook codebook{m, dsub, std::vector<float>(m * 256 * dsub)};
      for (float& c : codebook.centroids) c = 2 * normal(rng);
      const auto centroids_t = adc_internal::TransposeCentroids(codebook);
      std::vector<float> norms(m * 256);
      for (int e = 0; e < m * 256; ++e) {
        for (int j = 0; j < dsub; ++j)
          norms[e] += codebook.centroids[e * dsub + j] * codebook.centroids[e * dsub + j];
      }
      constexpr int kResiduals = 3;
      std::vector<float> x(kResiduals * m * dsub);
      for (float& v : x) v = 2 * normal(rng);
      const float* xs[kResiduals];
      for (int i = 0; i < kResiduals; ++i) xs[i] = x.data() + i * m * dsub;
      auto build = [&](auto residual_luts) {
        std::vector<float> tables(kResiduals * m * 256);
        float* rows[kResiduals];
        for (int i = 0; i < kResiduals; ++i) rows[i] = tables.data() + i * m * 256;
        residual_luts(xs, kResiduals, centroids_t.data(), norms.data(), m, dsub, rows);
        return tables;
      };
      const std::vector<float> want = build(adc_internal::ResidualLutsScalar);
      for (const TableKernels& simd : kSimdTableKernels) {
        if (!CpuSupports(simd.level)) continue;
        const std::vector<float> got = build(simd.tables.residual_luts);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
            << simd.name;
      }
    }
  }
}

// Row ranges and byte quantization: every SIMD kernel equals the scalar one, for both signs,
// entries that clamp at 255 and NaN entries (which quantize to 255).
TEST(AdcKernels, SimdRowRangesAndQuantizationEqualScalar) {
  std::mt19937_64 rng(37);
  std::uniform_real_distribution<float> uni(-40.0f, 40.0f);
  constexpr int kM = 9;
  std::vector<float> lut(kM * 256);
  for (float& v : lut) v = uni(rng);
  float lo[kM], hi[kM];
  adc_internal::RowRangesScalar(lut.data(), kM, lo, hi);
  for (float sign : {1.0f, -1.0f}) {
    float mins[kM];
    for (int m = 0; m < kM; ++m) mins[m] = sign > 0 ? lo[m] : -hi[m];
    std::vector<float> entries = lut;
    entries[3 * 256 + 7] = std::nanf("");
    // inverse 4: the widest rows (80 wide) reach 320 and clamp at 255.
    std::vector<uint8_t> want(kM * 256);
    adc_internal::QuantizeRowsScalar(entries.data(), kM, sign, mins, 4.0f, want.data());
    EXPECT_EQ(want[3 * 256 + 7], 255);
    for (const TableKernels& simd : kSimdTableKernels) {
      if (!CpuSupports(simd.level)) continue;
      SCOPED_TRACE(simd.name);
      float simd_lo[kM], simd_hi[kM];
      simd.tables.row_ranges(lut.data(), kM, simd_lo, simd_hi);
      EXPECT_EQ(std::memcmp(simd_lo, lo, sizeof(lo)), 0);
      EXPECT_EQ(std::memcmp(simd_hi, hi, sizeof(hi)), 0);
      std::vector<uint8_t> got(kM * 256);
      simd.tables.quantize_rows(entries.data(), kM, sign, mins, 4.0f, got.data());
      EXPECT_EQ(got, want);
    }
  }
}

struct PqFixture {
  faiss::IndexPQ index;
  std::vector<float> base;
  std::vector<float> queries;
};

// A faiss IndexPQ (d 32, 8 sub-quantizers) trained and filled with seeded clustered data.
void MakePq(Metric metric, PqFixture& f, int64_t n, int nq) {
  constexpr int kD = 32;
  omp_set_num_threads(1);  // faiss training; OpenMP spinning is slow on a shared 2-core box
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> centres(10 * kD);
  for (float& c : centres) c = 3 * normal(rng);
  auto sample = [&](std::vector<float>& out, int64_t rows) {
    out.resize(rows * kD);
    for (int64_t i = 0; i < rows; ++i) {
      const float* c = centres.data() + (i % 10) * kD;
      for (int j = 0; j < kD; ++j) out[i * kD + j] = c[j] + normal(rng);
    }
  };
  sample(f.base, n);
  sample(f.queries, nq);
  f.index = faiss::IndexPQ(kD, 8, 8,
                           metric == Metric::kL2 ? faiss::METRIC_L2 : faiss::METRIC_INNER_PRODUCT);
  f.index.train(n, f.base.data());
  f.index.add(n, f.base.data());
}

std::unique_ptr<SubsetAdc> AdcFor(const faiss::IndexPQ& index, Metric metric,
                                  std::vector<int64_t> offsets, AdcKernel kernel) {
  PqCodebook codebook{static_cast<int>(index.pq.M), static_cast<int>(index.pq.dsub),
                      index.pq.centroids};
  SubsetCodes codes{codebook.m, 0, 0, std::move(offsets), index.codes};
  absl::StatusOr<std::unique_ptr<SubsetAdc>> adc =
      SubsetAdc::Create(codebook, metric, std::move(codes), {1, kernel});
  EXPECT_TRUE(adc.ok()) << adc.status();
  return adc.ok() ? *std::move(adc) : nullptr;
}

TEST(PackedLines, AlignedToLinesAndLargeBlocksToHugePages) {
  for (const size_t lines : {size_t{1}, size_t{100}, adc_internal::kHugePageBytes / 64 + 1}) {
    adc_internal::PackedLines packed(lines);
    const auto address = reinterpret_cast<uintptr_t>(packed.data());
    EXPECT_EQ(address % 64, 0u) << lines << " lines";
    if (lines * sizeof(adc_internal::PackedLine) >= adc_internal::kHugePageBytes) {
      EXPECT_EQ(address % adc_internal::kHugePageBytes, 0u) << lines << " lines";
    }
  }
}

// Packed lines are left unset by resize (the packing writes every byte, padding lanes as code 0),
// but every other aligned buffer is value-initialised, as any vector: IvfAdc's table of zeros
// relies on it. The memory of a freed buffer, dirtied, is what malloc hands out again.
TEST(PackedLines, OtherAlignedBuffersAreValueInitialized) {
  for (int round = 0; round < 4; ++round) {
    {
      adc_internal::AlignedVector<float> dirty(4096);
      std::fill(dirty.begin(), dirty.end(), 1.0f);
    }
    const adc_internal::AlignedVector<float> fresh(4096);
    EXPECT_EQ(std::count(fresh.begin(), fresh.end(), 0.0f), 4096);
  }
}

// The VmFlags of this process's heap mappings, one line per mapping.
std::vector<std::string> HeapVmFlags() {
  std::ifstream smaps("/proc/self/smaps");
  std::vector<std::string> flags;
  bool in_heap = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.find(" [heap]") != std::string::npos) in_heap = true;
    if (in_heap && line.rfind("VmFlags:", 0) == 0) {
      flags.push_back(line);
      in_heap = false;
    }
  }
  return flags;
}

// Huge blocks are advised for transparent huge pages. The advice stays with the address range
// after a free; were the block heap memory, glibc would hand that range to the next allocations
// (LibTorch's tensors in the decoder, where it made the model ~20% slower). With glibc told to
// keep large blocks on the heap, as the CLI does (KeepFreedMemory), no heap range is advised
// after a huge block came and went.
TEST(PackedLines, FreedHugeBlocksLeaveNoAdvisedHeap) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer's allocator replaces glibc's heap";
#endif
  mallopt(M_MMAP_MAX, 0);
  {
    adc_internal::PackedLines packed(4 * adc_internal::kHugePageBytes / 64);
    packed[0].bytes[0] = 1;
  }
  std::vector<char> heap_block(8 * adc_internal::kHugePageBytes, 1);  // reuses any freed range
  const std::vector<std::string> flags = HeapVmFlags();
  mallopt(M_MMAP_MAX, 65536);  // glibc's default
  ASSERT_FALSE(flags.empty()) << "no [heap] mapping in /proc/self/smaps";
  for (const std::string& line : flags) EXPECT_THAT(line, Not(HasSubstr(" hg"))) << line;
}

// The filter keeps exactly the positions whose sums are within the final limit, min(cap, k-th
// smallest sum offered + margin), in the order offered, whether every lane is offered or only
// those under the filter's limit at the time (as the scan kernels offer them), and one filter
// reset between searches answers each as a fresh one.
TEST(CandidateFilter, KeepsExactlyThePositionsWithinTheFinalLimit) {
  std::mt19937_64 rng(41);
  adc_internal::CandidateFilter filter;
  for (const int blocks : {1, 40}) {
    std::vector<uint16_t> sums(blocks * kAdcBlock);
    for (uint16_t& q : sums) q = static_cast<uint16_t>(rng() % 2000 + (rng() % 7 == 0 ? 0 : 900));
    for (const auto& [k, margin, cap] : {std::tuple<int, int, uint16_t>{1, 0, 65535},
                                         {32, 34, 65535},
                                         {32, 34, 1000},
                                         {0, 34, 1200},
                                         {100, 5, 65535},
                                         {5000, 34, 65535}}) {
      std::vector<uint16_t> sorted = sums;
      std::sort(sorted.begin(), sorted.end());
      // Sums over the cap are never kept: a k-th smallest sum over the cap is not known.
      const bool enough = k > 0 && k <= static_cast<int>(sums.size()) && sorted[k - 1] <= cap;
      const uint16_t kth = enough ? sorted[k - 1] : 65535;
      const int limit = std::min<int>(cap, enough ? kth + margin : 65535);
      std::vector<std::pair<uint16_t, int64_t>> want;
      for (size_t p = 0; p < sums.size(); ++p) {
        if (sums[p] <= limit) want.emplace_back(sums[p], p);
      }
      for (const bool only_under_limit : {false, true}) {
        SCOPED_TRACE(absl::StrCat(blocks, " blocks, k ", k, " margin ", margin, " cap ", cap,
                                  only_under_limit ? ", lanes under the limit" : ""));
        filter.Reset(k, margin, cap);
        for (int b = 0; b < blocks; ++b) {
          const uint16_t* block = sums.data() + b * kAdcBlock;
          uint64_t below = 0;
          for (int lane = 0; lane < kAdcBlock; ++lane) {
            if (!only_under_limit || block[lane] <= filter.limit()) below |= uint64_t{1} << lane;
          }
          filter.Offer(block, below, int64_t{b} * kAdcBlock);
        }
        EXPECT_EQ(filter.Survivors(), want);
        EXPECT_EQ(filter.kth_sum(), kth);
      }
    }
  }
}

// ADC over all codes returns faiss IndexPQ's own distances (its distance tables) within 1e-4
// relative, for the same codes and codebook.
TEST(SquaredL2, EqualsTheDoubleSumWithinFloatRounding) {
  std::mt19937_64 rng(67);
  std::normal_distribution<float> normal;
  for (int d = 1; d <= 70; ++d) {
    std::vector<float> a(d), b(d);
    double want = 0.0;
    for (int j = 0; j < d; ++j) {
      a[j] = normal(rng);
      b[j] = 3.0f * normal(rng);
      want += (static_cast<double>(a[j]) - b[j]) * (static_cast<double>(a[j]) - b[j]);
    }
    EXPECT_NEAR(adc_internal::SquaredL2(a.data(), b.data(), d), want,
                (d / 16 + 6) * FLT_EPSILON * want)
        << "d=" << d;
  }
  const float same[3] = {1.5f, -2.0f, 0.25f};
  EXPECT_EQ(adc_internal::SquaredL2(same, same, 3), 0.0f);
}

TEST(SubsetAdc, DistancesEqualFaissPqWithinTolerance) {
  for (Metric metric : {Metric::kL2, Metric::kInnerProduct}) {
    SCOPED_TRACE(MetricName(metric));
    PqFixture f;
    constexpr int64_t kN = 3000;
    constexpr int kQ = 4;
    MakePq(metric, f, kN, kQ);
    std::vector<int64_t> offsets;
    for (int64_t o = 0; o <= kN; o += 100) offsets.push_back(o);
    auto adc = AdcFor(f.index, metric, offsets, BestAdcKernel());
    SubsetGroups groups(1);
    for (int64_t s = 0; s + 1 < static_cast<int64_t>(offsets.size()); ++s) {
      groups[0].push_back(s);
    }
    const std::vector<int32_t> row_group(kQ, 0);
    ASSERT_OK_AND_ASSIGN(SubsetResult got,
                         adc->SearchSubset({f.queries.data(), kQ, 32}, ShareGroups(groups),
                                           row_group, static_cast<int>(kN)));
    EXPECT_EQ(got.vectors_scanned, kN);
    std::vector<float> dist(kQ * kN);
    std::vector<faiss::Index::idx_t> ids(kQ * kN);
    f.index.search(kQ, f.queries.data(), kN, dist.data(), ids.data());
    for (int q = 0; q < kQ; ++q) {
      std::vector<float> faiss_by_id(kN), ours_by_id(kN);
      for (int64_t j = 0; j < kN; ++j) {
        faiss_by_id[ids[q * kN + j]] = dist[q * kN + j];
        ours_by_id[got.neighbors.ids[q * kN + j]] = got.neighbors.distances[q * kN + j];
      }
      for (int64_t i = 0; i < kN; ++i) {
        EXPECT_NEAR(ours_by_id[i], faiss_by_id[i], 1e-4 * std::max(1.0f, std::fabs(faiss_by_id[i])))
            << "query " << q << " vector " << i;
      }
    }
  }
}

// Only the group's sentences are searched; sentences outside the slice are skipped; results
// equal a brute force over the subset; the kernel choice does not change them.
TEST(SubsetAdc, SearchesOnlyTheSubsetAndMatchesBruteForce) {
  PqFixture f;
  constexpr int64_t kN = 2000;
  MakePq(Metric::kL2, f, kN, 6);
  std::vector<int64_t> offsets = {0};
  std::mt19937_64 rng(9);
  while (offsets.back() < kN)
    offsets.push_back(std::min<int64_t>(kN, offsets.back() + 1 + rng() % 30));
  const int64_t sentences = offsets.size() - 1;
  // This slice holds global sentences [100, 100 + sentences), tokens from 5000.
  PqCodebook codebook{8, 4, f.index.pq.centroids};
  SubsetGroups groups = {{100, 103, 150, 101, 7, 100 + sentences + 5}, {120, 121, 122}};
  const std::vector<int32_t> row_group = {0, 1, 0, 0, 1, 0};
  constexpr int kK = 12;
  std::vector<SubsetResult> results;
  for (AdcKernel kernel : kAllKernels) {
    if (!CpuSupports(kernel)) continue;
    SubsetCodes codes{8, 100, 5000, offsets, f.index.codes};
    ASSERT_OK_AND_ASSIGN(auto adc, SubsetAdc::Create(codebook, Metric::kL2, codes, {2, kernel}));
    // The engine searches on its 2 threads and leaves the caller's count (the model's, when a
    // decoder calls) as it found it.
    omp_set_num_threads(1);
    ASSERT_OK_AND_ASSIGN(SubsetResult r, adc->SearchSubset({f.queries.data(), 6, 32},
                                                           ShareGroups(groups), row_group, kK));
    EXPECT_EQ(omp_get_max_threads(), 1);
    results.push_back(std::move(r));
  }
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_EQ(results[i].neighbors.ids, results[0].neighbors.ids);
    EXPECT_EQ(results[i].neighbors.distances, results[0].neighbors.distances);
  }
  const SubsetResult& r = results[0];
  // Brute force over the subset with faiss's distance tables.
  std::vector<float> table(8 * 256);
  for (int row = 0; row < 6; ++row) {
    f.index.pq.compute_distance_table(f.queries.data() + row * 32, table.data());
    std::vector<std::pair<float, int64_t>> want;
    for (int64_t s : groups[row_group[row]]) {
      if (s < 100 || s >= 100 + sentences) continue;
      for (int64_t t = offsets[s - 100]; t < offsets[s - 100 + 1]; ++t) {
        float d = 0;
        for (int m = 0; m < 8; ++m) d += table[m * 256 + f.index.codes[t * 8 + m]];
        want.emplace_back(d, 5000 + t);
      }
    }
    std::sort(want.begin(), want.end());
    for (int j = 0; j < kK; ++j) {
      if (j >= static_cast<int>(want.size())) {
        EXPECT_EQ(r.neighbors.ids[row * kK + j], -1);
        continue;
      }
      EXPECT_NEAR(r.neighbors.distances[row * kK + j], want[j].first, 1e-4 * want[j].first);
      const int64_t id = r.neighbors.ids[row * kK + j];
      EXPECT_TRUE(
          std::any_of(want.begin(), want.end(), [id](const auto& c) { return c.second == id; }))
          << "row " << row << " returned id " << id << " outside its subset";
    }
  }
  // Group 0 has 4 sentences in the slice, group 1 three; each group is scanned once.
  int64_t expected_scanned = 0;
  for (const auto& g : groups) {
    for (int64_t s : g) {
      if (s >= 100 && s < 100 + sentences) expected_scanned += offsets[s - 99] - offsets[s - 100];
    }
  }
  EXPECT_EQ(r.vectors_scanned, expected_scanned);
}

TEST(SubsetAdc, BeamSharingEqualsSeparateGroups) {
  PqFixture f;
  MakePq(Metric::kL2, f, 1000, 11);
  std::vector<int64_t> offsets;
  for (int64_t o = 0; o <= 1000; o += 10) offsets.push_back(o);
  auto adc = AdcFor(f.index, Metric::kL2, offsets, BestAdcKernel());
  const std::vector<int64_t> subset = {3, 9, 10, 11, 50, 99};
  // 11 rows sharing one group (more than one pass of queries) vs each row alone.
  SubsetGroups shared = {subset};
  SubsetGroups separate(11, subset);
  std::vector<int32_t> all_zero(11, 0), own(11);
  for (int i = 0; i < 11; ++i) own[i] = i;
  ASSERT_OK_AND_ASSIGN(SubsetResult a, adc->SearchSubset({f.queries.data(), 11, 32},
                                                         ShareGroups(shared), all_zero, 7));
  ASSERT_OK_AND_ASSIGN(
      SubsetResult b, adc->SearchSubset({f.queries.data(), 11, 32}, ShareGroups(separate), own, 7));
  EXPECT_EQ(a.neighbors.ids, b.neighbors.ids);
  EXPECT_EQ(a.neighbors.distances, b.neighbors.distances);
  EXPECT_EQ(a.vectors_scanned * 11, b.vectors_scanned);
}

// The same search with the exact scalar kernel and each quantized kernel this CPU runs.
absl::StatusOr<std::vector<SubsetResult>> SearchWithEveryKernel(
    const PqCodebook& codebook, Metric metric, const std::vector<int64_t>& offsets,
    const std::vector<uint8_t>& code_bytes, MatrixView<const float> queries,
    const SubsetGroups& groups, const std::vector<int32_t>& row_group, int k, int threads) {
  std::vector<SubsetResult> results;
  for (AdcKernel kernel : kScalarAndQuantizedKernels) {
    if (!CpuSupports(kernel)) continue;
    SubsetCodes codes{codebook.m, 0, 0, offsets, code_bytes};
    ASSIGN_OR_RETURN(auto adc,
                     SubsetAdc::Create(codebook, metric, std::move(codes), {threads, kernel}));
    ASSIGN_OR_RETURN(SubsetResult r, adc->SearchSubset(queries, ShareGroups(groups), row_group, k));
    results.push_back(std::move(r));
  }
  return results;
}

// Ids and distance bits of every result equal the first's.
void ExpectSameAnswers(const std::vector<SubsetResult>& results) {
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_EQ(results[i].neighbors.ids, results[0].neighbors.ids) << i;
    EXPECT_EQ(
        std::memcmp(results[i].neighbors.distances.data(), results[0].neighbors.distances.data(),
                    results[0].neighbors.distances.size() * sizeof(float)),
        0)
        << i;
    EXPECT_EQ(results[i].vectors_scanned, results[0].vectors_scanned) << i;
  }
}

// The quantized two-stage kernels return exactly the exact scan's neighbours and distances (ids
// and float bits), for both metrics, k from 1 to more than the subset, beams of up to 11 rows,
// and codes drawn from 3 values per sub-quantizer so that many distances tie (ties rank by id).
// At M = 64 a beam's tables exceed one pass's budget and its queries scan runs of blocks in
// groups (FilterPackedBlocks).
TEST(SubsetAdc, QuantizedKernelsEqualTheExactScan) {
  constexpr int kDsub = 2;
  for (const int m : {16, 64}) {
    const int dim = m * kDsub;
    std::mt19937_64 rng(23);
    std::normal_distribution<float> normal;
    PqCodebook codebook{m, kDsub, std::vector<float>(m * 256 * kDsub)};
    for (float& c : codebook.centroids) c = normal(rng);
    std::vector<int64_t> offsets = {0};
    while (offsets.back() < 20000) offsets.push_back(offsets.back() + 1 + rng() % 40);
    const int64_t sentences = static_cast<int64_t>(offsets.size()) - 1;
    for (bool ties : {false, true}) {
      std::vector<uint8_t> code_bytes(offsets.back() * m);
      for (uint8_t& c : code_bytes) c = static_cast<uint8_t>(ties ? rng() % 3 : rng() % 256);
      std::vector<float> queries(11 * dim);
      for (float& x : queries) x = 2 * normal(rng);
      SubsetGroups groups(3);
      for (int g = 0; g < 3; ++g) {
        for (int s = 0; s < 50 * (g + 1) * (g + 1); ++s) groups[g].push_back(rng() % sentences);
        std::sort(groups[g].begin(), groups[g].end());
        groups[g].erase(std::unique(groups[g].begin(), groups[g].end()), groups[g].end());
      }
      const std::vector<int32_t> row_group = {0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2};
      for (Metric metric : {Metric::kL2, Metric::kInnerProduct}) {
        for (int k : {1, 7, 64, 3000}) {
          SCOPED_TRACE(
              absl::StrCat("m ", m, " ", MetricName(metric), " k=", k, ties ? " ties" : ""));
          ASSERT_OK_AND_ASSIGN(
              const std::vector<SubsetResult> results,
              SearchWithEveryKernel(codebook, metric, offsets, code_bytes,
                                    {queries.data(), 11, dim}, groups, row_group, k, 2));
          ExpectSameAnswers(results);
        }
      }
    }
  }
}

// A table whose entries are all equal (every centroid the same) cannot be quantized: the scan
// keeps every vector, and all distances tie, so the answer is the subset's k smallest ids.
TEST(SubsetAdc, DegenerateTablesKeepEveryVector) {
  constexpr int kM = 8, kDsub = 2, kDim = kM * kDsub;
  PqCodebook codebook{kM, kDsub, std::vector<float>(kM * 256 * kDsub, 0.5f)};
  std::vector<int64_t> offsets = {0};
  while (offsets.back() < 3000) offsets.push_back(offsets.back() + 7);
  std::mt19937_64 rng(29);
  std::vector<uint8_t> code_bytes(offsets.back() * kM);
  for (uint8_t& c : code_bytes) c = static_cast<uint8_t>(rng());
  const SubsetGroups groups = {{3, 40, 41, 200, 310}};
  const std::vector<float> queries(3 * kDim, 1.0f);
  for (AdcKernel kernel : kScalarAndQuantizedKernels) {
    if (!CpuSupports(kernel)) continue;
    SCOPED_TRACE(AdcKernelName(kernel));
    SubsetCodes codes{kM, 0, 0, offsets, code_bytes};
    ASSERT_OK_AND_ASSIGN(auto adc,
                         SubsetAdc::Create(codebook, Metric::kL2, std::move(codes), {1, kernel}));
    ASSERT_OK_AND_ASSIGN(SubsetResult r, adc->SearchSubset({queries.data(), 3, kDim},
                                                           ShareGroups(groups), {0, 0, 0}, 10));
    for (int row = 0; row < 3; ++row) {
      for (int j = 0; j < 10; ++j) {
        // Sentence 3 holds tokens 21..27, sentence 40 tokens 280..286.
        EXPECT_EQ(r.neighbors.ids[row * 10 + j], j < 7 ? 21 + j : 280 + (j - 7)) << row << j;
        EXPECT_EQ(r.neighbors.distances[row * 10 + j], kM * kDsub * 0.25f);
      }
    }
  }
}

// A table whose sums cannot be bounded usefully (entries near 1e8 that differ by a few units:
// the float rounding of the exact sums spans more than 16 bits of table steps) keeps every
// vector too, now with sums that differ; the answers equal the exact scan's.
TEST(SubsetAdc, UnboundedTablesAnswerAsTheExactScan) {
  constexpr int kM = 8, kDim = kM;  // dsub 1
  std::mt19937_64 rng(37);
  std::uniform_real_distribution<float> near_zero(0.0f, 0.001f);
  PqCodebook codebook{kM, 1, std::vector<float>(kM * 256)};
  for (float& c : codebook.centroids) c = near_zero(rng);
  const std::vector<float> queries(2 * kDim, 1e4f);
  std::vector<float> lut(kM * 256);
  adc_internal::LutScalar(queries.data(), adc_internal::TransposeCentroids(codebook).data(), kM, 1,
                          /*l2=*/true, lut.data());
  std::vector<uint8_t> table(kM * 256);
  const adc_internal::LutQuantization q =
      adc_internal::QuantizeLut(lut.data(), kM, Metric::kL2, table.data());
  ASSERT_TRUE(q.keeps_all());
  ASSERT_GT(*std::max_element(table.begin(), table.end()), 0);  // the sums differ
  std::vector<int64_t> offsets = {0};
  while (offsets.back() < 2000) offsets.push_back(offsets.back() + 9);
  std::vector<uint8_t> code_bytes(offsets.back() * kM);
  for (uint8_t& c : code_bytes) c = static_cast<uint8_t>(rng());
  const SubsetGroups groups = {{1, 5, 17, 30, 31, 150, 200}};
  ASSERT_OK_AND_ASSIGN(const std::vector<SubsetResult> results,
                       SearchWithEveryKernel(codebook, Metric::kL2, offsets, code_bytes,
                                             {queries.data(), 2, kDim}, groups, {0, 0}, 20, 1));
  ExpectSameAnswers(results);
}

// 3000 PQ codes of MakePq (L2, `nq` queries) in 200 sentences of 15 tokens: their offsets.
std::vector<int64_t> MakeSentencePq(PqFixture& f, int nq) {
  constexpr int64_t kN = 3000;
  MakePq(Metric::kL2, f, kN, nq);
  std::vector<int64_t> offsets;
  for (int64_t o = 0; o <= kN; o += 15) offsets.push_back(o);
  return offsets;
}

// Packed subsets kept between calls change no answer: repeated and interleaved groups, held for
// the whole test or by nobody after their call, with a cache large enough for all of them, one so
// small that every insertion evicts the previous entry, one too small for any subset (each is
// packed in the thread's own buffer), and none, all equal the exact scan call after call.
TEST(SubsetAdc, PackedSubsetCacheChangesNoAnswer) {
  PqFixture f;
  const std::vector<int64_t> offsets = MakeSentencePq(f, 6);
  auto exact = AdcFor(f.index, Metric::kL2, offsets, AdcKernel::kScalar);
  PqCodebook codebook{8, 4, f.index.pq.centroids};
  std::vector<std::unique_ptr<SubsetAdc>> cached;
  for (size_t bytes : {size_t{256} << 20, size_t{4096}, size_t{64}, size_t{0}}) {
    SubsetCodes codes{8, 0, 0, offsets, f.index.codes};
    ASSERT_OK_AND_ASSIGN(auto adc, SubsetAdc::Create(codebook, Metric::kL2, std::move(codes),
                                                     {1, AdcKernel::kQuantizedScalar, bytes}));
    cached.push_back(std::move(adc));
  }
  // Held for the whole test, except the odd calls' groups, which nobody holds after their call
  // (their subsets are dropped by later calls, or found again by equal groups).
  std::vector<std::shared_ptr<const SubsetGroups>> held;
  for (SubsetGroups groups : std::vector<SubsetGroups>{{{1, 5, 9}, {40, 41, 42, 43}},
                                                       {{1, 5, 9}, {40, 41, 42, 43}},
                                                       {{2, 5, 9}, {1, 5, 9}},
                                                       {{40, 41, 42, 43}, {7}},
                                                       {{1, 5, 9}, {199, 0}},
                                                       {{2, 5, 9}, {40, 41, 42, 43}}}) {
    held.push_back(ShareGroups(std::move(groups)));
  }
  const std::vector<int32_t> row_group = {0, 1, 0, 1, 1, 0};
  for (size_t c = 0; c < held.size(); ++c) {
    const std::shared_ptr<const SubsetGroups> groups = c % 2 == 1 ? ShareGroups(*held[c]) : held[c];
    ASSERT_OK_AND_ASSIGN(SubsetResult want,
                         exact->SearchSubset({f.queries.data(), 6, 32}, groups, row_group, 9));
    for (const auto& adc : cached) {
      ASSERT_OK_AND_ASSIGN(SubsetResult got,
                           adc->SearchSubset({f.queries.data(), 6, 32}, groups, row_group, 9));
      EXPECT_EQ(got.neighbors.ids, want.neighbors.ids) << "call " << c;
      EXPECT_EQ(got.neighbors.distances, want.neighbors.distances) << "call " << c;
      EXPECT_EQ(got.vectors_scanned, want.vectors_scanned) << "call " << c;
    }
  }
}

// Subset engines with a packed-subset cache over one seeded fixture, for the cache's tests.
struct CachedSubsets {
  PqFixture f;
  std::vector<int64_t> offsets = MakeSentencePq(f, 3);

  absl::StatusOr<std::unique_ptr<SubsetAdc>> Create() const {
    return SubsetAdc::Create(PqCodebook{8, 4, f.index.pq.centroids}, Metric::kL2,
                             {8, 0, 0, offsets, f.index.codes},
                             {1, AdcKernel::kQuantizedScalar, size_t{256} << 20});
  }
  // Three query rows: the first and last of them search the first group, the middle the last.
  absl::Status Search(const SubsetAdc& engine,
                      const std::shared_ptr<const SubsetGroups>& groups) const {
    const std::vector<int32_t> row_group = {0, static_cast<int32_t>(groups->size()) - 1, 0};
    return engine.SearchSubset({f.queries.data(), 3, 32}, groups, row_group, 5).status();
  }
  // What a fresh engine caches for one search of `groups`.
  size_t BytesAlone(const SubsetGroups& groups) const {
    absl::StatusOr<std::unique_ptr<SubsetAdc>> alone = Create();
    EXPECT_OK(alone.status());
    EXPECT_OK(Search(**alone, ShareGroups(groups)));
    return (*alone)->packed_bytes_cached();
  }
};

// A session's packed subsets stay cached while its groups are held, and once nobody holds them
// the next subsets packed take their place instead of growing the cache towards its bound.
TEST(SubsetAdc, DropsThePackedSubsetsOfGroupsNobodyHolds) {
  const CachedSubsets c;
  ASSERT_OK_AND_ASSIGN(auto adc, c.Create());
  std::shared_ptr<const SubsetGroups> first = ShareGroups({{1, 5, 9}, {40, 41, 42, 43}});
  ASSERT_OK(c.Search(*adc, first));
  const size_t first_bytes = adc->packed_bytes_cached();
  EXPECT_GT(first_bytes, 0);
  const std::shared_ptr<const SubsetGroups> second = ShareGroups({{100, 101}, {7, 150}});
  ASSERT_OK(c.Search(*adc, second));
  const size_t both_bytes = adc->packed_bytes_cached();
  EXPECT_GT(both_bytes, first_bytes);  // the first session's subsets are kept while it lasts
  ASSERT_OK(c.Search(*adc, first));
  EXPECT_EQ(adc->packed_bytes_cached(), both_bytes);  // and found again, nothing packed anew

  first.reset();  // the first session ends, after a step that found its subsets again
  const SubsetGroups third = {{190, 191, 192}};
  ASSERT_OK(c.Search(*adc, ShareGroups(third)));
  EXPECT_EQ(adc->packed_bytes_cached(), both_bytes - first_bytes + c.BytesAlone(third));
}

// A unary client sends equal groups anew with every request (nobody holds them in between): its
// subsets stay cached while it comes back between two sweeps, which other callers' packing runs.
TEST(SubsetAdc, KeepsTheSubsetsOfGroupsSentAgainWithEveryRequest) {
  const CachedSubsets c;
  ASSERT_OK_AND_ASSIGN(auto adc, c.Create());
  const SubsetGroups unary = {{3, 4, 5, 6}};
  const size_t unary_bytes = c.BytesAlone(unary);
  size_t sessions_bytes = 0;
  std::vector<std::shared_ptr<const SubsetGroups>> sessions;  // held: never dropped
  ASSERT_OK(c.Search(*adc, ShareGroups(unary)));
  for (int64_t i = 0; i < 4; ++i) {
    ASSERT_OK(c.Search(*adc, ShareGroups(unary)));  // found under another pointer: a second chance
    sessions.push_back(ShareGroups({{100 + i, 120 + i}}));
    ASSERT_OK(c.Search(*adc, sessions.back()));  // packs: a sweep
    sessions_bytes += c.BytesAlone(*sessions.back());
    EXPECT_EQ(adc->packed_bytes_cached(), unary_bytes + sessions_bytes) << "request " << i;
  }
  // The client stops: the next sweep drops its subsets.
  sessions.push_back(ShareGroups({{150, 151}}));
  ASSERT_OK(c.Search(*adc, sessions.back()));
  sessions_bytes += c.BytesAlone(*sessions.back());
  EXPECT_EQ(adc->packed_bytes_cached(), sessions_bytes);
}

// IVF-PQ lists with random codebooks and codes (the search is exact whatever the training):
// vectors spread over `nlist` lists, every 7th a copy of its predecessor's code (ties), list 0's
// centroid 1000 times farther out than the others (its biases span far more than a query
// table's steps, so its sums would overflow 16 bits: every vector of it is costed instead).
IvfPqLists RandomLists(int m, int dsub, int nlist, int vectors, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  IvfPqLists lists;
  lists.codebook = {m, dsub, std::vector<float>(static_cast<size_t>(m) * 256 * dsub)};
  for (float& c : lists.codebook.centroids) c = normal(rng);
  const int d = m * dsub;
  lists.coarse_centroids.resize(static_cast<size_t>(nlist) * d);
  for (float& c : lists.coarse_centroids) c = 3 * normal(rng);
  for (int j = 0; j < d; ++j) lists.coarse_centroids[j] *= 1000;
  lists.codes.resize(nlist);
  lists.ids.resize(nlist);
  for (int v = 0; v < vectors; ++v) {
    const int l = static_cast<int>(rng() % nlist);
    std::vector<uint8_t>& codes = lists.codes[l];
    const size_t at = codes.size();
    codes.resize(at + m);
    for (int s = 0; s < m; ++s) {
      codes[at + s] = v % 7 == 0 && at >= static_cast<size_t>(m) ? codes[at - m + s]
                                                                 : static_cast<uint8_t>(rng());
    }
    lists.ids[l].push_back(static_cast<uint32_t>(v));
  }
  return lists;
}

// The distance IvfAdc defines (ivf_adc.h), computed directly for one vector of `list` with
// `code`: ||q − c||² in float, plus (b + the canonical float sum of the entries of the query's
// table T = −2⟨q_m, centroid⟩), b = Σ_m (||r_m||² + 2⟨c_m, r_m⟩) in double, rounded to float.
float IvfDistance(const IvfPqLists& lists, const float* query, const float* t_table, int list,
                  const uint8_t* code) {
  const PqCodebook& pq = lists.codebook;
  const int d = pq.dim();
  const float* c = lists.coarse_centroids.data() + static_cast<size_t>(list) * d;
  const float x_norm = adc_internal::SquaredL2(query, c, d);
  double b = 0.0;
  for (int m = 0; m < pq.m; ++m) {
    const float* r = pq.centroids.data() + (static_cast<size_t>(m) * 256 + code[m]) * pq.dsub;
    float norm = 0.0f;
    double dot = 0.0;
    for (int j = 0; j < pq.dsub; ++j) {
      norm += r[j] * r[j];
      dot += static_cast<double>(c[m * pq.dsub + j]) * r[j];
    }
    b += norm + 2.0 * dot;
  }
  float cost;
  adc_internal::ScanScalar(&t_table, 1, code, 1, pq.m, &cost);
  return x_norm + (static_cast<float>(b) + cost);
}

// The k nearest of every vector in the probed lists by IvfDistance (ties to the smaller id).
Neighbors BruteForceIvf(const IvfPqLists& lists, MatrixView<const float> queries,
                        MatrixView<const int64_t> probes, int k) {
  const PqCodebook& pq = lists.codebook;
  const auto centroids_t = adc_internal::TransposeCentroids(pq);
  const std::vector<float> zeros(pq.m * 256, 0.0f);
  std::vector<float> table(pq.m * 256);
  Neighbors out = Neighbors::Missing(queries.rows, k, Metric::kL2, /*with_values=*/false);
  for (int64_t r = 0; r < queries.rows; ++r) {
    const float* query = queries.row(r);
    float* tables[1] = {table.data()};
    adc_internal::ResidualLutsScalar(&query, 1, centroids_t.data(), zeros.data(), pq.m, pq.dsub,
                                     tables);
    std::vector<std::pair<float, int64_t>> all;
    for (int p = 0; p < probes.cols; ++p) {
      const int l = static_cast<int>(probes.row(r)[p]);
      for (size_t v = 0; v < lists.ids[l].size(); ++v) {
        all.emplace_back(IvfDistance(lists, query, table.data(), l, &lists.codes[l][v * pq.m]),
                         lists.ids[l][v]);
      }
    }
    std::sort(all.begin(), all.end());
    for (size_t j = 0; j < all.size() && j < static_cast<size_t>(k); ++j) {
      out.distances[r * k + j] = all[j].first;
      out.ids[r * k + j] = all[j].second;
    }
  }
  return out;
}

// rows x d queries of independent standard normal values.
Matrix<float> NormalQueries(int64_t rows, int d, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  Matrix<float> queries(rows, d);
  for (int64_t i = 0; i < queries.size(); ++i) queries.data()[i] = normal(rng);
  return queries;
}

// Lists 0 .. nlist - 1 in a random order.
std::vector<int64_t> ShuffledLists(int nlist, std::mt19937_64& rng) {
  std::vector<int64_t> order(nlist);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

// Rows searched together (each list scanned once for all rows that probe it, in passes of up to
// 8 rows, in chunks of rows) answer as each row searched alone: more rows than one chunk holds,
// lists probed by dozens of rows, repeated rows, rows that probe one list, 1 and 2 threads.
TEST(IvfAdc, RowsSearchedTogetherAnswerAsEachRowAlone) {
  std::mt19937_64 rng(73);
  constexpr int kM = 16, kDsub = 4, kNlist = 12, kRows = 700, kNprobe = 5, kK = 12;
  const IvfPqLists lists = RandomLists(kM, kDsub, kNlist, 5000, rng);
  Matrix<float> queries = NormalQueries(kRows, kM * kDsub, rng);
  for (int r = 100; r < 110; ++r) {  // repeated rows
    std::copy(queries.row(7), queries.row(8), queries.row(r));
  }
  Matrix<int64_t> probes(kRows, kNprobe);
  for (int r = 0; r < kRows; ++r) {
    const std::vector<int64_t> order = ShuffledLists(kNlist, rng);
    for (int p = 0; p < kNprobe; ++p) probes.at(r, p) = r % 50 == 0 && p > 0 ? -1 : order[p];
  }
  for (AdcKernel kernel : kQuantizedKernels) {
    if (!CpuSupports(kernel)) continue;
    for (int threads : {1, 2}) {
      SCOPED_TRACE(absl::StrCat(AdcKernelName(kernel), " threads=", threads));
      ASSERT_OK_AND_ASSIGN(auto adc, IvfAdc::Create(lists, {threads, kernel}));
      ASSERT_OK_AND_ASSIGN(Neighbors together, adc->Search(queries.view(), probes.view(), kK));
      for (int r = 0; r < kRows; ++r) {
        const MatrixView<const float> query{queries.row(r), 1, queries.cols()};
        const MatrixView<const int64_t> row_probes{probes.row(r), 1, kNprobe};
        ASSERT_OK_AND_ASSIGN(Neighbors alone, adc->Search(query, row_probes, kK));
        ASSERT_TRUE(std::equal(alone.ids.begin(), alone.ids.end(), together.id_row(r))) << r;
        ASSERT_EQ(std::memcmp(alone.distances.data(), together.distance_row(r), kK * sizeof(float)),
                  0)
            << r;
      }
    }
  }
}

// A list a row names twice (first among them, its nearest) is searched once for it: the same
// answer, bit for bit, as naming each list once. Offered twice, a vector counted twice among the
// k smallest upper bounds, so a true neighbour could be pruned and an id come back twice.
TEST(IvfAdc, ListsProbedTwiceAnswerAsProbedOnce) {
  std::mt19937_64 rng(79);
  constexpr int kM = 16, kDsub = 4, kNlist = 12, kRows = 40, kNprobe = 4, kK = 12;
  const IvfPqLists lists = RandomLists(kM, kDsub, kNlist, 5000, rng);
  const Matrix<float> queries = NormalQueries(kRows, kM * kDsub, rng);
  Matrix<int64_t> once(kRows, kNprobe);
  Matrix<int64_t> twice(kRows, 2 * kNprobe);
  for (int r = 0; r < kRows; ++r) {
    const std::vector<int64_t> order = ShuffledLists(kNlist, rng);
    for (int p = 0; p < kNprobe; ++p) once.at(r, p) = order[p];
    const int repeated[2 * kNprobe] = {0, 1, 0, 2, 3, 1, 3, 2};
    for (int p = 0; p < 2 * kNprobe; ++p) twice.at(r, p) = order[repeated[p]];
  }
  for (AdcKernel kernel : kQuantizedKernels) {
    if (!CpuSupports(kernel)) continue;
    SCOPED_TRACE(AdcKernelName(kernel));
    ASSERT_OK_AND_ASSIGN(auto adc, IvfAdc::Create(lists, {1, kernel}));
    ASSERT_OK_AND_ASSIGN(const Neighbors expected, adc->Search(queries.view(), once.view(), kK));
    ASSERT_OK_AND_ASSIGN(const Neighbors got, adc->Search(queries.view(), twice.view(), kK));
    EXPECT_EQ(got.ids, expected.ids);
    EXPECT_EQ(std::memcmp(got.distances.data(), expected.distances.data(),
                          expected.distances.size() * sizeof(float)),
              0);
  }
}

// The pre-scan and the re-ranking change no answer: ids and distance bits equal the brute-force
// search of the probed lists, for k from 1 to more than the probed lists hold, 1 to all lists
// probed (list 0, costed vector by vector, included), queries near stored vectors and far from
// all of them, both quantized kernels.
TEST(IvfAdc, AnswersAsBruteForceOverTheProbedListsBitForBit) {
  std::mt19937_64 rng(61);
  std::normal_distribution<float> normal;
  for (auto [m, dsub] : {std::pair{8, 2}, std::pair{16, 4}, std::pair{20, 3}}) {
    constexpr int kNlist = 24, kVectors = 6000, kRows = 30;
    const IvfPqLists lists = RandomLists(m, dsub, kNlist, kVectors, rng);
    const int d = m * dsub;
    // Queries: reconstructions of stored vectors plus noise, and a few far away.
    Matrix<float> queries(kRows, d);
    for (int r = 0; r < kRows; ++r) {
      const int l = 1 + static_cast<int>(rng() % (kNlist - 1));
      const int64_t count = static_cast<int64_t>(lists.ids[l].size());
      const uint8_t* code = lists.codes[l].data() + (count > 0 ? rng() % count : 0) * m;
      for (int j = 0; j < d; ++j) {
        const float r_j =
            count > 0
                ? lists.codebook
                      .centroids[(static_cast<size_t>(j / dsub) * 256 + code[j / dsub]) * dsub +
                                 j % dsub]
                : 0.0f;
        queries.at(r, j) = lists.coarse_centroids[l * d + j] + r_j + 0.3f * normal(rng) +
                           (r % 10 == 9 ? 50.0f : 0.0f);
      }
    }
    for (int nprobe : {1, 4, kNlist}) {
      // Probes: lists by coarse distance, nearest first; row 0 also probes the far list 0.
      Matrix<int64_t> probes(kRows, nprobe);
      for (int r = 0; r < kRows; ++r) {
        std::vector<std::pair<float, int64_t>> by_distance;
        for (int l = 0; l < kNlist; ++l) {
          float dist = 0;
          for (int j = 0; j < d; ++j) {
            const float diff = queries.at(r, j) - lists.coarse_centroids[l * d + j];
            dist += diff * diff;
          }
          by_distance.push_back({dist, l});
        }
        std::sort(by_distance.begin(), by_distance.end());
        for (int p = 0; p < nprobe; ++p) probes.at(r, p) = by_distance[p].second;
        if (r == 0) probes.at(r, nprobe - 1) = 0;
      }
      for (int k : {1, 10, 100, 7000}) {
        const Neighbors want = BruteForceIvf(lists, queries.view(), probes.view(), k);
        for (AdcKernel kernel : kQuantizedKernels) {
          if (!CpuSupports(kernel)) continue;
          SCOPED_TRACE(
              absl::StrCat("m=", m, " nprobe=", nprobe, " k=", k, " ", AdcKernelName(kernel)));
          ASSERT_OK_AND_ASSIGN(auto adc, IvfAdc::Create(lists, {2, kernel}));
          omp_set_num_threads(1);
          ASSERT_OK_AND_ASSIGN(Neighbors got, adc->Search(queries.view(), probes.view(), k));
          EXPECT_EQ(omp_get_max_threads(), 1) << "the caller's OpenMP thread count changed";
          EXPECT_EQ(got.ids, want.ids);
          EXPECT_EQ(std::memcmp(got.distances.data(), want.distances.data(),
                                want.distances.size() * sizeof(float)),
                    0);
        }
      }
    }
  }
}

TEST(SubsetAdc, RejectsInconsistentInput) {
  PqCodebook codebook{2, 2, std::vector<float>(2 * 256 * 2)};
  EXPECT_THAT(SubsetAdc::Create(codebook, Metric::kL2, {2, 0, 0, {0, 3}, {1, 2}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("offsets say 3")));
  EXPECT_THAT(SubsetAdc::Create(codebook, Metric::kL2, {3, 0, 0, {0}, {}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("m = 3")));
  ASSERT_OK_AND_ASSIGN(auto adc,
                       SubsetAdc::Create(codebook, Metric::kL2, {2, 0, 0, {0, 1}, {1, 2}}, {}));
  std::vector<float> q(4);
  EXPECT_THAT(adc->SearchSubset({q.data(), 1, 4}, ShareGroups({{0}}), std::vector<int32_t>{1}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("subset group 1")));
  EXPECT_THAT(adc->SearchSubset({q.data(), 1, 3}, ShareGroups({{0}}), std::vector<int32_t>{0}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dimension 3")));
}

}  // namespace
}  // namespace knnserve
