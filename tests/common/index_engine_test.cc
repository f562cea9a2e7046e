#include "common/index/index_engine.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/index/builder.h"
#include "common/index/faiss_index.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/index_test_util.h"
#include "tests/testing/neighbors.h"
#include "tests/testing/temp_dir.h"

namespace knnserve {
namespace {

using ::knnserve::testing::FreshTempDir;
using ::knnserve::testing::IsOk;
using ::knnserve::testing::MakeDatastore;
using ::knnserve::testing::MakeQueries;
using ::knnserve::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kDim = 16;
constexpr int64_t kRows = 6000;

const testing::Datastore& Data() {
  static const testing::Datastore* ds = new testing::Datastore(MakeDatastore(kRows, kDim, 24, 7));
  return *ds;
}

IndexBuildOptions Options(const std::string& factory, int shards) {
  IndexBuildOptions o;
  o.factory = factory;
  o.shards = shards;
  o.threads = 1;
  o.chunk_rows = 1000;
  o.train_size = 2600;  // enough for 256-centroid PQ codebooks; keeps training fast
  o.opq_iterations = 4;
  o.progress.out = nullptr;
  o.progress.interactive = 0;
  o.progress.percent_step = 100;
  return o;
}

std::string Build(const std::string& name, const std::string& factory, int shards,
                  bool with_values = true) {
  const std::string dir = FreshTempDir(name).string();
  MatrixKeySource keys(Data().keys.view());
  const MemoryValueSource values(Data().values);
  absl::StatusOr<IndexManifest> m =
      BuildIndex(keys, with_values ? &values : nullptr, Options(factory, shards), dir);
  EXPECT_THAT(m, IsOk());
  return dir;
}

// Index directories are built once per binary run and shared by the tests that only read them.
const std::string& Built(const std::string& factory, int shards) {
  static auto* built = new std::map<std::pair<std::string, int>, std::string>();
  auto [it, inserted] = built->try_emplace({factory, shards});
  if (inserted) {
    std::string name = absl::StrCat("built_", factory, "_", shards);
    std::replace_if(
        name.begin(), name.end(), [](char c) { return !std::isalnum(c); }, '_');
    it->second = Build(name, factory, shards);
  }
  return it->second;
}

std::unique_ptr<SearchEngine> Local(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<SearchEngine>> e = CreateLocalEngine(dir, {.threads = 1});
  EXPECT_THAT(e, IsOk());
  return e.ok() ? *std::move(e) : nullptr;
}

// Exact k nearest by squared L2, ties to the smaller id.
std::vector<int64_t> BruteForce(const float* q, int k) {
  std::vector<std::pair<float, int64_t>> all(kRows);
  for (int64_t i = 0; i < kRows; ++i) {
    float d = 0;
    for (int j = 0; j < kDim; ++j)
      d += (q[j] - Data().keys.at(i, j)) * (q[j] - Data().keys.at(i, j));
    all[i] = {d, i};
  }
  std::partial_sort(all.begin(), all.begin() + k, all.end());
  std::vector<int64_t> ids;
  for (int j = 0; j < k; ++j) ids.push_back(all[j].second);
  return ids;
}

TEST(IndexEngine, FlatEqualsBruteForceAndCarriesValues) {
  auto engine = Local(Built("Flat", 1));
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->info().dim, kDim);
  EXPECT_TRUE(engine->info().has_values);
  const Matrix<float> q = MakeQueries(Data().keys, 20, 11);
  ASSERT_OK_AND_ASSIGN(EngineResult r, engine->Search(testing::FullQuery(q, 10)));
  for (int64_t row = 0; row < q.rows(); ++row) {
    const std::vector<int64_t> want = BruteForce(q.row(row), 10);
    for (int j = 0; j < 10; ++j) {
      const int64_t id = r.neighbors.ids[row * 10 + j];
      EXPECT_EQ(id, want[j]) << "row " << row << " rank " << j;
      EXPECT_EQ(r.neighbors.values[row * 10 + j], Data().values.tokens[id]);
    }
  }
}

void ExpectSameNeighbors(const EngineResult& a, const EngineResult& b) {
  testing::ExpectSameNeighborsUpToRounding(a.neighbors, b.neighbors);
}

TEST(IndexEngine, ShardedFlatEqualsUnshardedUpToRounding) {
  auto one = Local(Built("Flat", 1));
  auto four = Local(Built("Flat", 4));
  const Matrix<float> q = MakeQueries(Data().keys, 40, 12);
  ASSERT_OK_AND_ASSIGN(EngineResult a, one->Search(testing::FullQuery(q, 16)));
  ASSERT_OK_AND_ASSIGN(EngineResult b, four->Search(testing::FullQuery(q, 16)));
  ExpectSameNeighbors(a, b);
  EXPECT_EQ(a.neighbors.values, b.neighbors.values);
}

TEST(IndexEngine, ShardedIvfPqEqualsUnshardedUpToRounding) {
  auto one = Local(Built("IVF32,PQ8", 1));
  auto three = Local(Built("IVF32,PQ8", 3));
  const Matrix<float> q = MakeQueries(Data().keys, 40, 13);
  ASSERT_OK_AND_ASSIGN(EngineResult a, one->Search(testing::FullQuery(q, 16, 4)));
  ASSERT_OK_AND_ASSIGN(EngineResult b, three->Search(testing::FullQuery(q, 16, 4)));
  ExpectSameNeighbors(a, b);
}

// Recall@10 of IVFPQ (nprobe 8 of 32 lists) against exact search on clustered data.
TEST(IndexEngine, IvfPqRecallAboveFloor) {
  auto engine = Local(Built("IVF32,PQ8", 3));
  const Matrix<float> q = MakeQueries(Data().keys, 100, 14);
  ASSERT_OK_AND_ASSIGN(EngineResult r, engine->Search(testing::FullQuery(q, 10, 8)));
  int hits = 0;
  for (int64_t row = 0; row < q.rows(); ++row) {
    const std::vector<int64_t> want = BruteForce(q.row(row), 10);
    const std::set<int64_t> got(r.neighbors.ids.begin() + row * 10,
                                r.neighbors.ids.begin() + row * 10 + 10);
    for (int64_t id : want) hits += got.count(id);
  }
  const double recall = hits / 1000.0;
  RecordProperty("recall_at_10", std::to_string(recall));
  EXPECT_GE(recall, 0.5);
}

// Serving form: 4-byte local ids in the inverted lists, identical answers.
TEST(FaissIndex, CompactIdsKeepsAnswersAndCostsCodesPlusFourBytes) {
  ASSERT_OK_AND_ASSIGN(auto index, FaissIndex::Create("IVF16,PQ8", kDim, Metric::kL2, 1));
  ASSERT_THAT(index->Train({Data().keys.data(), 2600, kDim}), IsOk());
  ASSERT_THAT(index->Add(Data().keys.view()), IsOk());
  const Matrix<float> q = MakeQueries(Data().keys, 20, 22);
  ASSERT_OK_AND_ASSIGN(Neighbors before, index->Search(q.view(), {10, 4, 0}));
  EXPECT_EQ(index->InvertedListBytesPerVector(), 8 + 8);
  ASSERT_THAT(index->CompactIds(), IsOk());
  EXPECT_EQ(index->InvertedListBytesPerVector(), 8 + 4);
  ASSERT_OK_AND_ASSIGN(Neighbors after, index->Search(q.view(), {10, 4, 0}));
  EXPECT_EQ(before.ids, after.ids);
  EXPECT_EQ(before.distances, after.distances);
  EXPECT_THAT(index->Add({Data().keys.data(), 1, kDim}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("faiss")));
}

TEST(IndexEngine, OpqPcaFactoriesBuildAndSearch) {
  for (const char* factory : {"OPQ4_16,IVF16,PQ4", "PCA8,IVF16,PQ4", "IVF16_HNSW8,PQ4"}) {
    SCOPED_TRACE(factory);
    auto engine = Local(Built(factory, 2));
    ASSERT_NE(engine, nullptr);
    const Matrix<float> q = MakeQueries(Data().keys, 5, 15);
    SearchQuery query = testing::FullQuery(q, 8, 4);
    query.params.ef_search = 32;
    ASSERT_OK_AND_ASSIGN(EngineResult r, engine->Search(query));
    EXPECT_GE(r.neighbors.ids[0], 0);
  }
}

TEST(IndexEngine, SingleShardEngineReturnsGlobalIdsOfItsRange) {
  const std::string& dir = Built("Flat", 4);
  ASSERT_OK_AND_ASSIGN(auto shard, CreateEngine(dir, 1, {.threads = 1}));
  const EngineInfo& info = shard->info();
  EXPECT_GT(info.id_begin, 0);
  EXPECT_EQ(Data().values.offsets[info.sentence_begin], info.id_begin);
  EXPECT_EQ(Data().values.offsets[info.sentence_end], info.id_end);
  const Matrix<float> q = MakeQueries(Data().keys, 10, 16);
  ASSERT_OK_AND_ASSIGN(EngineResult r, shard->Search(testing::FullQuery(q, 5)));
  for (size_t i = 0; i < r.neighbors.ids.size(); ++i) {
    EXPECT_GE(r.neighbors.ids[i], info.id_begin);
    EXPECT_LT(r.neighbors.ids[i], info.id_end);
    EXPECT_EQ(r.neighbors.values[i], Data().values.tokens[r.neighbors.ids[i]]);
  }
  EXPECT_THAT(CreateEngine(dir, 4, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shard 4")));
}

TEST(IndexEngine, RejectsWrongDimensionAndNaNQueries) {
  auto engine = Local(Built("Flat", 1));
  EXPECT_THAT(engine->Search(testing::FullQuery(Matrix<float>(2, kDim + 1), 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dimension")));
  Matrix<float> q(2, kDim);
  q.at(1, 3) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(engine->Search(testing::FullQuery(q, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("queries[1][3]")));
}

void Rewrite(const std::string& path, const std::function<void(std::string&)>& edit) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  edit(bytes);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(IndexEngine, RefusesCorruptOrTruncatedShardNamingTheFile) {
  const std::string dir = FreshTempDir("corrupt").string();
  std::filesystem::copy(Built("IVF32,PQ8", 3), dir);
  Rewrite(dir + "/shard-00001.faiss", [](std::string& b) { b[b.size() / 2] ^= 0x5A; });
  EXPECT_THAT(CreateLocalEngine(dir, {}),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("shard-00001.faiss"), HasSubstr("sha256"))));
  EXPECT_THAT(CreateEngine(dir, 0, {}), IsOk());

  Rewrite(dir + "/shard-00000.subset", [](std::string& b) { b.resize(b.size() - 3); });
  EXPECT_THAT(CreateEngine(dir, 0, {}),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("shard-00000.subset"), HasSubstr("bytes"))));
}

std::set<int64_t> TokensOf(const std::vector<int64_t>& sentences) {
  std::set<int64_t> tokens;
  for (int64_t s : sentences) {
    for (int64_t t = Data().values.offsets[s]; t < Data().values.offsets[s + 1]; ++t) {
      tokens.insert(t);
    }
  }
  return tokens;
}

TEST(IndexEngine, SubsetSearchReturnsOnlySubsetTokensWithValues) {
  for (const char* factory : {"IVF32,PQ8", "OPQ4_16,IVF16,PQ4"}) {
    SCOPED_TRACE(factory);
    auto engine = Local(Built(factory, 1));
    const Matrix<float> q = MakeQueries(Data().keys, 10, 18);
    const SearchQuery query =
        testing::SubsetQuery(q, 8, Data().values.num_sentences(), 20, /*beam=*/5, 19);
    ASSERT_OK_AND_ASSIGN(EngineResult r, engine->Search(query));
    int64_t expected_scanned = 0;
    for (const auto& g : *query.subset_groups) expected_scanned += TokensOf(g).size();
    EXPECT_EQ(r.vectors_searched, expected_scanned);
    for (int64_t row = 0; row < q.rows(); ++row) {
      const std::set<int64_t> allowed = TokensOf((*query.subset_groups)[query.row_group[row]]);
      for (int j = 0; j < 8; ++j) {
        const int64_t id = r.neighbors.ids[row * 8 + j];
        ASSERT_TRUE(allowed.count(id)) << "row " << row << " id " << id;
        EXPECT_EQ(r.neighbors.values[row * 8 + j], Data().values.tokens[id]);
        if (j > 0)
          EXPECT_LE(r.neighbors.distances[row * 8 + j - 1], r.neighbors.distances[row * 8 + j]);
      }
    }
  }
}

TEST(IndexEngine, ShardedSubsetSearchEqualsUnsharded) {
  auto one = Local(Built("IVF32,PQ8", 1));
  auto three = Local(Built("IVF32,PQ8", 3));
  const Matrix<float> q = MakeQueries(Data().keys, 12, 20);
  const SearchQuery query =
      testing::SubsetQuery(q, 10, Data().values.num_sentences(), 40, /*beam=*/4, 21);
  ASSERT_OK_AND_ASSIGN(EngineResult a, one->Search(query));
  ASSERT_OK_AND_ASSIGN(EngineResult b, three->Search(query));
  EXPECT_EQ(a.neighbors.ids, b.neighbors.ids);
  EXPECT_EQ(a.neighbors.distances, b.neighbors.distances);
  EXPECT_EQ(a.neighbors.values, b.neighbors.values);
  EXPECT_EQ(a.vectors_searched, b.vectors_searched);
}

TEST(IndexEngine, SubsetSearchNeedsSubsetCodes) {
  auto engine = Local(Built("Flat", 1));
  const Matrix<float> q = MakeQueries(Data().keys, 2, 17);
  EXPECT_THAT(engine->Search(testing::SubsetQuery(q, 4, Data().values.num_sentences(), 5, 1, 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("subset")));
}

}  // namespace
}  // namespace knnserve
