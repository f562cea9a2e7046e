// CudaSubsetAdc against SubsetAdc's exact scalar scan, on a CUDA device (skipped without one).
#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/adc/cuda/cuda_subset_adc.h"
#include "common/adc/subset_adc.h"
#include "common/index/builder.h"
#include "common/index/subset_device.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/index_test_util.h"
#include "tests/testing/temp_dir.h"

namespace knnserve {
namespace {

using ::knnserve::testing::StatusIs;
using ::testing::HasSubstr;

#define SKIP_WITHOUT_CUDA_DEVICE() \
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

// Random codebook and codes: sentences of 1 .. 40 tokens, ~20000 tokens, the slice starting at
// sentence 100 and token 5000. With `ties`, each code byte takes one of 3 values, so that many
// distances tie (ties rank by id).
struct Fixture {
  PqCodebook codebook;
  SubsetCodes codes;
  std::vector<float> queries;
  SubsetGroups groups;
  std::vector<int32_t> row_group;

  Fixture(int m, int dsub, bool ties, std::mt19937_64& rng) {
    std::normal_distribution<float> normal;
    codebook = {m, dsub, std::vector<float>(static_cast<size_t>(m) * 256 * dsub)};
    for (float& c : codebook.centroids) c = normal(rng);
    codes = {m, 100, 5000, {0}, {}};
    while (codes.offsets.back() < 20000)
      codes.offsets.push_back(codes.offsets.back() + 1 + rng() % 40);
    codes.codes.resize(codes.offsets.back() * m);
    for (uint8_t& c : codes.codes) c = static_cast<uint8_t>(ties ? rng() % 3 : rng() % 256);
    const int64_t sentences = codes.num_sentences();
    // Group 0: a few sentences; 1: unused by any row; 2: hundreds, some outside the slice
    // (another shard's); 3: only sentences outside the slice; 4: all of the slice.
    groups.resize(5);
    for (int s = 0; s < 5; ++s) groups[0].push_back(100 + rng() % sentences);
    for (int s = 0; s < 50; ++s) groups[1].push_back(100 + rng() % sentences);
    for (int s = 0; s < 400; ++s) groups[2].push_back(rng() % (sentences + 200));
    groups[3] = {0, 1, 2, 99, 100 + sentences, 100 + sentences + 7};
    for (int64_t i = 0; i < sentences; ++i) groups[4].push_back(100 + i);
    for (auto& g : groups) {
      std::sort(g.begin(), g.end());
      g.erase(std::unique(g.begin(), g.end()), g.end());
    }
    row_group = {2, 0, 2, 2, 3, 2, 2, 0, 2, 4, 4};
    queries.resize(row_group.size() * codebook.dim());
    for (float& x : queries) x = 2 * normal(rng);
  }

  MatrixView<const float> query_view() const {
    return {queries.data(), static_cast<int64_t>(row_group.size()), codebook.dim()};
  }
};

void ExpectSameAnswer(const SubsetResult& got, const SubsetResult& want) {
  EXPECT_EQ(got.neighbors.ids, want.neighbors.ids);
  ASSERT_EQ(got.neighbors.distances.size(), want.neighbors.distances.size());
  EXPECT_EQ(std::memcmp(got.neighbors.distances.data(), want.neighbors.distances.data(),
                        want.neighbors.distances.size() * sizeof(float)),
            0);
  EXPECT_EQ(got.vectors_scanned, want.vectors_scanned);
}

// Same ids and the same distance bits as the CPU's exact scan, for both metrics, k from 1 to
// more than a group holds (k = 1000 over all 20000 tokens takes a reduction pass), M a multiple of
// 16 (vector loads), not (byte loads and a partial last chunk), and too large for shared memory (m
// = 256: tables read from global memory).
TEST(CudaSubsetAdc, EqualsTheCpuExactScanBitForBit) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937_64 rng(41);
  for (auto [m, dsub] : {std::pair{16, 2}, std::pair{64, 4}, std::pair{20, 3}, std::pair{256, 1}}) {
    for (bool ties : {false, true}) {
      const Fixture f(m, dsub, ties, rng);
      for (Metric metric : {Metric::kL2, Metric::kInnerProduct}) {
        ASSERT_OK_AND_ASSIGN(
            std::shared_ptr<const SubsetAdc> cpu,
            SubsetAdc::Create(f.codebook, metric, f.codes, {1, AdcKernel::kScalar}));
        ASSERT_OK_AND_ASSIGN(auto gpu, CudaSubsetAdc::Create(cpu));
        for (int k : {1, 7, 64, 1000, 3000}) {
          SCOPED_TRACE(
              absl::StrCat("m=", m, " ", MetricName(metric), " k=", k, ties ? " ties" : ""));
          ASSERT_OK_AND_ASSIGN(
              SubsetResult want,
              cpu->SearchSubset(f.query_view(), ShareGroups(f.groups), f.row_group, k));
          ASSERT_OK_AND_ASSIGN(
              SubsetResult got,
              gpu->SearchSubset(f.query_view(), ShareGroups(f.groups), f.row_group, k));
          ExpectSameAnswer(got, want);
        }
      }
    }
  }
}

// Threads searching at once (each on its own stream) get the answers of a lone call.
TEST(CudaSubsetAdc, ConcurrentCallsAnswerAsALoneCall) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::mt19937_64 rng(5);
  const Fixture f(32, 4, false, rng);
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<const SubsetAdc> cpu,
      SubsetAdc::Create(f.codebook, Metric::kL2, f.codes, {1, AdcKernel::kScalar}));
  ASSERT_OK_AND_ASSIGN(auto gpu, CudaSubsetAdc::Create(cpu));
  ASSERT_OK_AND_ASSIGN(SubsetResult want,
                       cpu->SearchSubset(f.query_view(), ShareGroups(f.groups), f.row_group, 32));
  std::vector<std::thread> threads;
  std::vector<SubsetResult> got(4 * 8);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int c = 0; c < 8; ++c) {
        absl::StatusOr<SubsetResult> r =
            gpu->SearchSubset(f.query_view(), ShareGroups(f.groups), f.row_group, 32);
        if (r.ok()) got[t * 8 + c] = *std::move(r);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const SubsetResult& r : got) ExpectSameAnswer(r, want);
}

TEST(CudaSubsetAdc, RejectsWhatTheCpuEngineRejects) {
  SKIP_WITHOUT_CUDA_DEVICE();
  PqCodebook codebook{2, 2, std::vector<float>(2 * 256 * 2)};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<const SubsetAdc> cpu,
                       SubsetAdc::Create(codebook, Metric::kL2, {2, 0, 0, {0, 1}, {1, 2}}, {}));
  ASSERT_OK_AND_ASSIGN(auto gpu, CudaSubsetAdc::Create(cpu));
  std::vector<float> q(4);
  EXPECT_THAT(gpu->SearchSubset({q.data(), 1, 4}, ShareGroups({{0}}), std::vector<int32_t>{1}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("subset group 1")));
  EXPECT_THAT(gpu->SearchSubset({q.data(), 1, 3}, ShareGroups({{0}}), std::vector<int32_t>{0}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dimension 3")));
  EXPECT_THAT(gpu->SearchSubset({q.data(), 1, 4}, ShareGroups({{0}}), std::vector<int32_t>{0}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("k")));
}

// Engines whose subset ADC runs on the GPU (--subset-device cuda) answer subset searches as the
// CPU engines do (ids, distances, values, codes scanned): one shard of two, and both shards
// merged in-process.
TEST(SubsetDevice, CudaEnginesAnswerAsCpuEngines) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const testing::Datastore data = testing::MakeDatastore(6000, 16, 24, 7);
  const std::string dir = testing::FreshTempDir("subset_device_cuda").string();
  IndexBuildOptions build;
  build.factory = "OPQ4_16,IVF16,PQ4";
  build.shards = 2;
  build.train_size = 2600;
  build.opq_iterations = 4;
  build.progress.out = nullptr;
  MatrixKeySource keys(data.keys.view());
  const MemoryValueSource values(data.values);
  ASSERT_OK(BuildIndex(keys, &values, build, dir).status());
  IndexEngineOptions cpu_options{.threads = 2};
  IndexEngineOptions gpu_options{.threads = 2};
  ASSERT_OK(UseSubsetDevice("cuda", gpu_options));
  const Matrix<float> q = testing::MakeQueries(data.keys, 20, 3);
  const SearchQuery query =
      testing::SubsetQuery(q, 10, data.values.num_sentences(), 60, /*beam=*/5, 4);
  ASSERT_OK_AND_ASSIGN(auto cpu_shard, CreateEngine(dir, 1, cpu_options));
  ASSERT_OK_AND_ASSIGN(auto gpu_shard, CreateEngine(dir, 1, gpu_options));
  ASSERT_OK_AND_ASSIGN(auto cpu_local, CreateLocalEngine(dir, cpu_options));
  ASSERT_OK_AND_ASSIGN(auto gpu_local, CreateLocalEngine(dir, gpu_options));
  for (auto [cpu, gpu] :
       {std::pair{cpu_shard.get(), gpu_shard.get()}, std::pair{cpu_local.get(), gpu_local.get()}}) {
    ASSERT_OK_AND_ASSIGN(EngineResult want, cpu->Search(query));
    ASSERT_OK_AND_ASSIGN(EngineResult got, gpu->Search(query));
    EXPECT_EQ(got.neighbors.ids, want.neighbors.ids);
    EXPECT_EQ(got.neighbors.distances, want.neighbors.distances);
    EXPECT_EQ(got.neighbors.values, want.neighbors.values);
    EXPECT_EQ(got.vectors_searched, want.vectors_searched);
  }
}

}  // namespace
}  // namespace knnserve
