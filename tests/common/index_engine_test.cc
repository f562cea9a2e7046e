#include "common/index/index_engine.h"

#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/index/builder.h"
#include "common/index/faiss_index.h"
#include "common/index/manifest.h"
#include "common/index/shard_data.h"
#include "common/index/subset_device.h"
#include "common/status_macros.h"
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
  // Refused before faiss sees them: IVF-Flat's add throws from compact lists inside an OpenMP
  // region, where the exception would end the process.
  EXPECT_THAT(index->Add({Data().keys.data(), 1, kDim}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("serving form")));
  EXPECT_THAT(index->Save(::testing::TempDir() + "/compact.faiss"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("serving form")));
}

// A Flat index in serving form keeps its vectors' norms instead of recomputing them per call.
// Searches too large for one matrix product (700 queries x 6000 vectors) run faiss's blocked
// BLAS search on them: bit-identical answers.
TEST(FaissIndex, FlatServingFormKeepsNormsAndAnswersLargeSearchesBitForBit) {
  ASSERT_OK_AND_ASSIGN(auto index, FaissIndex::Create("Flat", kDim, Metric::kL2, 1));
  ASSERT_THAT(index->Add(Data().keys.view()), IsOk());
  const Matrix<float> q = MakeQueries(Data().keys, 700, 23);
  for (const int k : {1, 10, 100}) {
    omp_set_num_threads(3);  // the caller's count (a decoder's model threads) survives a search
    ASSERT_OK_AND_ASSIGN(Neighbors before, index->Search(q.view(), {k, 0, 0}));
    EXPECT_EQ(omp_get_max_threads(), 3);
    ASSERT_OK_AND_ASSIGN(auto serving, FaissIndex::Create("Flat", kDim, Metric::kL2, 1));
    ASSERT_THAT(serving->Add(Data().keys.view()), IsOk());
    ASSERT_THAT(serving->PrepareForServing(AdcKernel::kScalar), IsOk());
    ASSERT_OK_AND_ASSIGN(Neighbors after, serving->Search(q.view(), {k, 0, 0}));
    EXPECT_EQ(before.ids, after.ids);
    EXPECT_EQ(before.distances, after.distances);
    EXPECT_THAT(serving->Add({Data().keys.data(), 1, kDim}),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("serving form")));
  }
}

// ---- Serving form with IvfAdc (the quantized IVF-PQ list scan) -------------------------------

// A trained, filled index loaded again from its bytes (as a shard loads it) and put in serving
// form with `kernel`: the exact kernels keep faiss's own list scan, the quantized ones IvfAdc.
std::unique_ptr<FaissIndex> Serving(const std::string& factory, AdcKernel kernel) {
  static auto* bytes = new std::map<std::string, std::vector<uint8_t>>();
  if (!bytes->count(factory)) {
    auto index = FaissIndex::Create(factory, kDim, Metric::kL2, 1);
    EXPECT_THAT(index, IsOk());
    EXPECT_THAT((*index)->Train({Data().keys.data(), 2600, kDim}), IsOk());
    EXPECT_THAT((*index)->Add(Data().keys.view()), IsOk());
    const std::string path = (FreshTempDir("serving") / "index.faiss").string();
    EXPECT_THAT((*index)->Save(path), IsOk());
    auto read = ReadFileBytes(path);
    EXPECT_THAT(read, IsOk());
    (*bytes)[factory] = *read;
  }
  const std::vector<uint8_t>& file = (*bytes)[factory];
  SpanReader in(file.data(), file.size(), factory);
  auto index = FaissIndex::LoadForServing(in, 1, kernel);
  EXPECT_THAT(index, IsOk());
  return *std::move(index);
}

// faiss and IvfAdc compute the same ADC distance differently (faiss: ||q − c||² plus a
// precomputed table minus 2⟨q, r⟩; IvfAdc: the residual's own table), so they agree within
// 1e-4 relative, the tolerance for ADC against faiss. Rows must agree position by
// position in distance and in id, except that ids may swap among entries whose distances are
// equal up to that tolerance.
void ExpectSameNeighborsUpToNearTies(const Neighbors& want, const Neighbors& got) {
  ASSERT_EQ(want.ids.size(), got.ids.size());
  const auto close = [](float a, float b) {
    return a == b || std::abs(a - b) <= 1e-4f * std::max(1.0f, std::abs(a));  // a == b: missing
  };
  for (int64_t r = 0; r < want.rows; ++r) {
    for (int j = 0; j < want.k; ++j) {
      const size_t i = r * want.k + j;
      EXPECT_TRUE(close(want.distances[i], got.distances[i]))
          << "row " << r << " rank " << j << ": " << want.distances[i] << " vs "
          << got.distances[i];
      if (want.ids[i] == got.ids[i]) continue;
      // A swap: the id we got must be one faiss ranks at a tied distance.
      bool tied = false;
      for (int t = 0; t < want.k; ++t) {
        const size_t u = r * want.k + t;
        tied |= want.ids[u] == got.ids[i] && close(want.distances[u], got.distances[i]);
      }
      EXPECT_TRUE(tied) << "row " << r << " rank " << j << ": id " << got.ids[i]
                        << " is not a near-tie of faiss's " << want.ids[i];
    }
  }
}

TEST(FaissIndex, FlatServingFormAnswersSmallSearchesAsFaissUpToRounding) {
  // Up to 4M products (here up to 300 queries x 6000 vectors) the serving form takes them in one
  // matrix product and selects each query's nearest itself: by a threshold sampled from 1024
  // (6000 vectors) or 256 (1024 vectors, an IVF coarse quantizer's size) distances for small
  // k, among all distances for large k. Other roundings, the same neighbours.
  for (const int64_t rows : {kRows, int64_t{1024}}) {
    const MatrixView<const float> keys{Data().keys.data(), rows, kDim};
    ASSERT_OK_AND_ASSIGN(auto faiss_flat, FaissIndex::Create("Flat", kDim, Metric::kL2, 2));
    ASSERT_THAT(faiss_flat->Add(keys), IsOk());
    ASSERT_OK_AND_ASSIGN(auto serving, FaissIndex::Create("Flat", kDim, Metric::kL2, 2));
    ASSERT_THAT(serving->Add(keys), IsOk());
    ASSERT_THAT(serving->PrepareForServing(AdcKernel::kScalar), IsOk());
    for (const int64_t n : {1, 3, 40, 300}) {
      const Matrix<float> q = MakeQueries(Data().keys, n, 31 + n);
      for (const int k : {1, 8, 512, 7000}) {  // 7000 > rows: the missing tail is -1
        SCOPED_TRACE(absl::StrCat(rows, " vectors, ", n, " queries, k ", k));
        ASSERT_OK_AND_ASSIGN(Neighbors want, faiss_flat->Search(q.view(), {k, 0, 0}));
        ASSERT_OK_AND_ASSIGN(Neighbors got, serving->Search(q.view(), {k, 0, 0}));
        ExpectSameNeighborsUpToNearTies(want, got);
        EXPECT_EQ(std::count(got.ids.begin(), got.ids.end(), -1), k > rows ? n * (k - rows) : 0);
      }
    }
  }
}

// `vectors` vectors of which every 16th is a copy of `query`: the vectors nearest to it.
Matrix<float> CopiesOfQueryEvery16th(const Matrix<float>& query, int64_t vectors) {
  Matrix<float> keys(vectors, kDim);
  for (int64_t i = 0; i < vectors; ++i) {
    const float* from = i % 16 == 0 ? query.row(0) : Data().keys.row(i % kRows);
    std::copy(from, from + kDim, keys.row(i));
  }
  return keys;
}

absl::StatusOr<std::unique_ptr<FaissIndex>> FlatServing(const Matrix<float>& keys) {
  ASSIGN_OR_RETURN(auto serving, FaissIndex::Create("Flat", kDim, Metric::kL2, 1));
  RETURN_IF_ERROR(serving->Add(keys.view()));
  RETURN_IF_ERROR(serving->PrepareForServing(AdcKernel::kScalar));
  return serving;
}

// The serving form's selection takes a threshold from every 16th distance. Where those are
// all copies of the query, fewer than k vectors fall under it, and the selection must take the
// k nearest among all vectors instead.
TEST(FaissIndex, FlatServingFormIsExactWhereTheSampledThresholdKeepsTooFew) {
  const Matrix<float> q = MakeQueries(Data().keys, 1, 5);
  const Matrix<float> keys = CopiesOfQueryEvery16th(q, 16384);
  ASSERT_OK_AND_ASSIGN(auto faiss_flat, FaissIndex::Create("Flat", kDim, Metric::kL2, 1));
  ASSERT_THAT(faiss_flat->Add(keys.view()), IsOk());
  ASSERT_OK_AND_ASSIGN(const std::unique_ptr<FaissIndex> serving, FlatServing(keys));
  ASSERT_OK_AND_ASSIGN(Neighbors want, faiss_flat->Search(q.view(), {2000, 0, 0}));
  ASSERT_OK_AND_ASSIGN(Neighbors got, serving->Search(q.view(), {2000, 0, 0}));
  ExpectSameNeighborsUpToNearTies(want, got);
  for (int j = 0; j < 1024; ++j) EXPECT_EQ(got.ids[j] % 16, 0) << "rank " << j;
  EXPECT_NE(got.ids[1500] % 16, 0);  // past the 1024 copies: the nearest other vectors
}

// Equal distances rank by id, whichever selection runs: the one-pass heap for a few nearest (an
// IVF coarse search's nprobe), the sampled threshold for many. The query is the origin, so its
// copies lie at distance 0 exactly, whatever the products' rounding.
TEST(FaissIndex, FlatServingFormRanksEqualDistancesById) {
  const Matrix<float> q(1, kDim);  // zeros
  ASSERT_OK_AND_ASSIGN(const std::unique_ptr<FaissIndex> serving,
                       FlatServing(CopiesOfQueryEvery16th(q, 4096)));
  for (const int k : {1, 8, 64, 65, 200}) {
    SCOPED_TRACE(absl::StrCat("k ", k));
    ASSERT_OK_AND_ASSIGN(Neighbors got, serving->Search(q.view(), {k, 0, 0}));
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(got.ids[j], 16 * j) << "rank " << j;
      ASSERT_EQ(got.distances[j], 0.0f) << "rank " << j;
    }
  }
}

TEST(IvfAdc, ServingFormAnswersAsFaissUpToRounding) {
  const Matrix<float> q = MakeQueries(Data().keys, 200, 31);
  for (const char* factory : {"IVF32,PQ8", "IVF16,PQ16", "OPQ4_16,IVF16,PQ4", "IVF16_HNSW8,PQ4"}) {
    SCOPED_TRACE(factory);
    const std::unique_ptr<FaissIndex> faiss_scan = Serving(factory, AdcKernel::kScalar);
    const std::unique_ptr<FaissIndex> ivf_adc = Serving(factory, AdcKernel::kQuantizedScalar);
    EXPECT_FALSE(faiss_scan->uses_ivf_adc());
    EXPECT_TRUE(ivf_adc->uses_ivf_adc());
    for (const SearchParams params : {SearchParams{10, 4, 0}, SearchParams{1, 1, 0},
                                      SearchParams{50, 32, 0}, SearchParams{3000, 2, 0}}) {
      SCOPED_TRACE(absl::StrCat("k ", params.k, " nprobe ", params.nprobe));
      ASSERT_OK_AND_ASSIGN(Neighbors want, faiss_scan->Search(q.view(), params));
      ASSERT_OK_AND_ASSIGN(Neighbors got, ivf_adc->Search(q.view(), params));
      ExpectSameNeighborsUpToNearTies(want, got);
    }
  }
}

// LoadForServing skips the table faiss computes while reading an IVF-PQ index, and computes it
// when faiss's own scan will search: the same answers, to the bit, as an index read whole.
TEST(FaissIndex, LoadedForServingSearchesAsAnIndexReadWhole) {
  const Matrix<float> q = MakeQueries(Data().keys, 100, 34);
  for (const char* factory : {"IVF32,PQ8", "OPQ4_16,IVF16,PQ4"}) {
    SCOPED_TRACE(factory);
    auto built = FaissIndex::Create(factory, kDim, Metric::kL2, 1);
    ASSERT_THAT(built, IsOk());
    ASSERT_THAT((*built)->Train({Data().keys.data(), 2600, kDim}), IsOk());
    ASSERT_THAT((*built)->Add(Data().keys.view()), IsOk());
    const std::string path = (FreshTempDir("load") / "index.faiss").string();
    ASSERT_OK_AND_ASSIGN(const FileDigest digest, (*built)->Save(path));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, ReadFileBytes(path));
    SpanReader whole(bytes.data(), bytes.size(), path);
    ASSERT_OK_AND_ASSIGN(auto read, FaissIndex::Read(whole, 1));
    ASSERT_THAT(read->PrepareForServing(AdcKernel::kScalar), IsOk());
    ASSERT_OK_AND_ASSIGN(auto file, VerifiedFileReader::Open(path, digest));
    ASSERT_OK_AND_ASSIGN(auto loaded, FaissIndex::LoadForServing(*file, 1, AdcKernel::kScalar));
    EXPECT_FALSE(loaded->uses_ivf_adc());
    ASSERT_OK_AND_ASSIGN(Neighbors want, read->Search(q.view(), {10, 4, 0}));
    ASSERT_OK_AND_ASSIGN(Neighbors got, loaded->Search(q.view(), {10, 4, 0}));
    EXPECT_EQ(got.ids, want.ids);
    EXPECT_EQ(got.distances, want.distances);
  }
}

// Identical codes give identical ADC distances: with every vector stored 3 times the ties must
// fall to the smaller id, as faiss's (normalised) answers do.
TEST(IvfAdc, TiesFallToTheSmallerIdAsInFaiss) {
  Matrix<float> keys(3 * 2000, kDim);
  for (int64_t i = 0; i < keys.rows(); ++i) {
    std::copy(Data().keys.row(i % 2000), Data().keys.row(i % 2000) + kDim, keys.row(i));
  }
  auto built = FaissIndex::Create("IVF16,PQ8", kDim, Metric::kL2, 1);
  ASSERT_THAT(built, IsOk());
  ASSERT_THAT((*built)->Train({Data().keys.data(), 2600, kDim}), IsOk());
  ASSERT_THAT((*built)->Add(keys.view()), IsOk());
  const std::string path = (FreshTempDir("ties") / "index.faiss").string();
  ASSERT_THAT((*built)->Save(path), IsOk());
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  SpanReader for_faiss(bytes.data(), bytes.size(), path);
  SpanReader for_ivf_adc(bytes.data(), bytes.size(), path);
  ASSERT_OK_AND_ASSIGN(auto faiss_scan,
                       FaissIndex::LoadForServing(for_faiss, 1, AdcKernel::kScalar));
  ASSERT_OK_AND_ASSIGN(auto ivf_adc,
                       FaissIndex::LoadForServing(for_ivf_adc, 1, AdcKernel::kQuantizedScalar));
  const Matrix<float> q = MakeQueries(Data().keys, 50, 32);
  ASSERT_OK_AND_ASSIGN(Neighbors want, faiss_scan->Search(q.view(), {12, 4, 0}));
  ASSERT_OK_AND_ASSIGN(Neighbors got, ivf_adc->Search(q.view(), {12, 4, 0}));
  ExpectSameNeighborsUpToNearTies(want, got);
  for (int64_t r = 0; r < got.rows; ++r) {
    for (int j = 0; j + 1 < got.k; ++j) {
      const size_t i = r * got.k + j;
      if (got.distances[i] == got.distances[i + 1]) EXPECT_LT(got.ids[i], got.ids[i + 1]);
    }
  }
}

// The quantized kernels differ only in how the integer pre-scan is computed: bit-identical
// answers.
TEST(IvfAdc, SimdKernelsEqualScalarBitForBit) {
  const Matrix<float> q = MakeQueries(Data().keys, 200, 33);
  for (const char* factory : {"IVF32,PQ8", "IVF16,PQ16"}) {
    SCOPED_TRACE(factory);
    const auto scalar = Serving(factory, AdcKernel::kQuantizedScalar);
    for (const AdcKernel kernel : {AdcKernel::kQuantizedAvx2, AdcKernel::kQuantizedVbmi}) {
      if (!CpuSupports(kernel)) continue;
      SCOPED_TRACE(AdcKernelName(kernel));
      const auto simd = Serving(factory, kernel);
      for (const SearchParams params : {SearchParams{10, 4, 0}, SearchParams{100, 16, 0}}) {
        ASSERT_OK_AND_ASSIGN(Neighbors a, scalar->Search(q.view(), params));
        ASSERT_OK_AND_ASSIGN(Neighbors b, simd->Search(q.view(), params));
        EXPECT_EQ(a.ids, b.ids);
        EXPECT_EQ(a.distances, b.distances);
      }
    }
  }
}

// Serving form keeps codes plus a 4-byte id and a 4-byte bias (lists padded to whole 64-vector
// blocks), and it is frozen: nothing can be added and it cannot be written back.
TEST(IvfAdc, ServingFormCostsCodesPlusEightBytesAndIsFrozen) {
  const auto index = Serving("IVF16,PQ8", AdcKernel::kQuantizedScalar);
  const double padding = 16.0 * 63 * 8 / kRows;  // at most 63 lanes per list
  EXPECT_GE(index->InvertedListBytesPerVector(), 8 + 4 + 4);
  EXPECT_LE(index->InvertedListBytesPerVector(), 8 + 4 + 4 + padding);
  EXPECT_THAT(index->Add({Data().keys.data(), 1, kDim}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("serving form")));
  EXPECT_THAT(index->Save((FreshTempDir("frozen") / "x.faiss").string()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("serving form")));
  const auto flat = Serving("Flat", AdcKernel::kQuantizedScalar);
  EXPECT_FALSE(flat->uses_ivf_adc());  // only IVF-PQ lists are scanned by IvfAdc
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

// Both engines answer `query` identically: ids, distances, values and coverage.
void ExpectIdenticalAnswers(const SearchEngine& a, const SearchEngine& b,
                            const SearchQuery& query) {
  ASSERT_OK_AND_ASSIGN(EngineResult x, a.Search(query));
  ASSERT_OK_AND_ASSIGN(EngineResult y, b.Search(query));
  EXPECT_EQ(x.neighbors.ids, y.neighbors.ids);
  EXPECT_EQ(x.neighbors.distances, y.neighbors.distances);
  EXPECT_EQ(x.neighbors.values, y.neighbors.values);
  EXPECT_EQ(x.vectors_searched, y.vectors_searched);
}

TEST(IndexEngine, ShardedSubsetSearchEqualsUnsharded) {
  auto one = Local(Built("IVF32,PQ8", 1));
  auto three = Local(Built("IVF32,PQ8", 3));
  const Matrix<float> q = MakeQueries(Data().keys, 12, 20);
  ExpectIdenticalAnswers(
      *one, *three, testing::SubsetQuery(q, 10, Data().values.num_sentences(), 40, /*beam=*/4, 21));
}

// In-process, the shards' IvfAdc lists become one engine: full and subset answers (ids,
// distances, values) equal the shard-by-shard merge exactly, for both quantized kernels.
TEST(IndexEngine, MergedShardListsEqualShardByShardMerge) {
  const std::string dir = Built("IVF32,PQ8", 3);
  for (const AdcKernel kernel :
       {AdcKernel::kQuantizedScalar, AdcKernel::kQuantizedAvx2, AdcKernel::kQuantizedVbmi}) {
    if (!CpuSupports(kernel)) continue;
    SCOPED_TRACE(AdcKernelName(kernel));
    ASSERT_OK_AND_ASSIGN(auto merged, CreateLocalEngine(dir, {.threads = 2, .adc_kernel = kernel}));
    ASSERT_OK_AND_ASSIGN(
        auto by_shard,
        CreateLocalEngine(dir, {.threads = 2, .adc_kernel = kernel, .merge_shards = false}));
    EXPECT_EQ(merged->info().id_begin, 0);
    EXPECT_EQ(merged->info().id_end, kRows);
    EXPECT_EQ(merged->info().sentence_end, Data().values.num_sentences());
    const Matrix<float> q = MakeQueries(Data().keys, 30, 24);
    for (const int nprobe : {4, 32}) {
      ExpectIdenticalAnswers(*by_shard, *merged, testing::FullQuery(q, 10 * nprobe / 4, nprobe));
    }
    ExpectIdenticalAnswers(
        *by_shard, *merged,
        testing::SubsetQuery(q, 10, Data().values.num_sentences(), 40, /*beam=*/5, 25));
  }
}

// Without full search an engine holds the subset codes alone: its subset answers equal the full
// engine's exactly (merged in-process and shard by shard), full searches are refused, and the
// faiss index files are never read (a damaged one does not stop it loading). An index without
// subset codes leaves it nothing to search.
TEST(IndexEngine, SubsetOnlyEngineAnswersSubsetsAsTheFullEngineWithoutTheFaissIndex) {
  const std::string dir = FreshTempDir("subset_only").string();
  std::filesystem::copy(Built("IVF32,PQ8", 3), dir);
  const Matrix<float> q = MakeQueries(Data().keys, 30, 26);
  const SearchQuery subset =
      testing::SubsetQuery(q, 10, Data().values.num_sentences(), 40, /*beam=*/5, 27);
  ASSERT_OK_AND_ASSIGN(auto full, CreateLocalEngine(dir, {.threads = 2}));
  for (const bool merge : {true, false}) {
    SCOPED_TRACE(merge ? "merged" : "shard by shard");
    ASSERT_OK_AND_ASSIGN(
        auto subset_only,
        CreateLocalEngine(dir, {.threads = 2, .merge_shards = merge, .full_search = false}));
    ExpectIdenticalAnswers(*full, *subset_only, subset);
    EXPECT_THAT(subset_only->Search(testing::FullQuery(q, 10, 4)),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("subset searches only")));
  }
  ASSERT_OK_AND_ASSIGN(auto shard_full, CreateEngine(dir, 1, {.threads = 1}));
  ASSERT_OK_AND_ASSIGN(auto shard_subset,
                       CreateEngine(dir, 1, {.threads = 1, .full_search = false}));
  ExpectIdenticalAnswers(*shard_full, *shard_subset, subset);

  Rewrite(dir + "/shard-00001.faiss", [](std::string& b) { b[b.size() / 2] ^= 0x5A; });
  EXPECT_THAT(CreateLocalEngine(dir, {}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("shard-00001.faiss")));
  EXPECT_THAT(CreateLocalEngine(dir, {.full_search = false}), IsOk());

  const std::string no_values = Build("subset_only_no_values", "IVF32,PQ8", 2, false);
  EXPECT_THAT(CreateLocalEngine(no_values, {.full_search = false}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no subset codes")));
}

// --subset-device: cpu leaves the CPU engine; cuda sets the GPU searcher in CUDA builds and is
// refused, naming the missing build option, in others; any other name is refused.
TEST(SubsetDevice, CpuCudaOrAnErrorNamingTheProblem) {
  IndexEngineOptions options;
  ASSERT_OK(UseSubsetDevice("cpu", options));
  EXPECT_FALSE(options.subset_searcher);
  EXPECT_THAT(UseSubsetDevice("gpu", options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected cpu or cuda")));
#ifdef KNNSERVE_WITH_CUDA
  ASSERT_OK(UseSubsetDevice("cuda", options));
  EXPECT_TRUE(options.subset_searcher);
#else
  EXPECT_THAT(UseSubsetDevice("cuda", options),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("KNNSERVE_WITH_CUDA=ON")));
  EXPECT_FALSE(options.subset_searcher);
#endif
}

TEST(IndexEngine, SubsetSearchNeedsSubsetCodes) {
  auto engine = Local(Built("Flat", 1));
  const Matrix<float> q = MakeQueries(Data().keys, 2, 17);
  EXPECT_THAT(engine->Search(testing::SubsetQuery(q, 4, Data().values.num_sentences(), 5, 1, 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("subset")));
}

// The datastore before it grew: the first `sentences` sentences of Data().
struct GrownFrom {
  MatrixView<const float> keys;
  DatastoreValues values;
};

GrownFrom FirstSentences(int64_t sentences) {
  const DatastoreValues& all = Data().values;
  GrownFrom part{{Data().keys.data(), all.offsets[sentences], kDim}, {}};
  part.values.offsets.assign(all.offsets.begin(), all.offsets.begin() + sentences + 1);
  part.values.tokens.assign(all.tokens.begin(), all.tokens.begin() + all.offsets[sentences]);
  return part;
}

IndexAddOptions AddOptions(int shards) {
  IndexAddOptions o;
  o.shards = shards;
  o.chunk_rows = 1000;
  o.progress.out = nullptr;
  return o;
}

// An index built on the first two thirds of a datastore and grown by AddToIndex to all of it
// answers as one index of every row made from the same trained state: the same neighbours (ids,
// values, distances up to rounding) as the trained index holding all rows, Flat and IVF-PQ. The
// new shards follow the old ones, which are left as they were; the new subset codes are the
// index's subset quantizer's codes of the added rows.
TEST(IndexAdd, AddedShardsAnswerAsOneIndexOfAllTheRows) {
  const int64_t old_sentences = Data().values.num_sentences() * 2 / 3;
  const GrownFrom part = FirstSentences(old_sentences);
  const int64_t old_rows = part.keys.rows;
  const MatrixKeySource all_keys(Data().keys.view());
  const MemoryValueSource all_values(Data().values);
  const Matrix<float> q = MakeQueries(Data().keys, 40, 31);
  for (const char* factory : {"Flat", "IVF32,PQ8"}) {
    SCOPED_TRACE(factory);
    const std::string dir =
        FreshTempDir(absl::StrCat("grown_", factory[0] == 'F' ? "flat" : "ivf")).string();
    const MatrixKeySource part_keys(part.keys);
    const MemoryValueSource part_values(part.values);
    ASSERT_OK_AND_ASSIGN(const IndexManifest before,
                         BuildIndex(part_keys, &part_values, Options(factory, 2), dir));
    ASSERT_OK_AND_ASSIGN(const IndexManifest after,
                         AddToIndex(all_keys, &all_values, AddOptions(2), dir));

    EXPECT_EQ(after.total_vectors, kRows);
    EXPECT_EQ(after.num_sentences, Data().values.num_sentences());
    ASSERT_EQ(after.shards.size(), 4u);
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(after.shards[s].index.digest.sha256, before.shards[s].index.digest.sha256);
      EXPECT_EQ(after.shards[s].id_end, before.shards[s].id_end);
    }
    EXPECT_EQ(after.shards[2].id_begin, old_rows);
    EXPECT_EQ(after.shards[2].sentence_begin, old_sentences);
    EXPECT_EQ(after.shards[2].index.file, "shard-00002.faiss");
    ASSERT_OK_AND_ASSIGN(const IndexManifest read_back, ReadManifest(dir));
    EXPECT_EQ(read_back.ToJson(), after.ToJson());

    // The reference: the trained state of the shards with every row added to it, one index.
    ASSERT_OK_AND_ASSIGN(auto shard0, OpenChecked(dir, before.shards[0].index));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<FaissIndex> whole,
                         FaissIndex::ReadTrainedEmpty(*shard0, /*threads=*/1));
    EXPECT_EQ(whole->size(), 0);
    ASSERT_OK(whole->Add(Data().keys.view()));
    ASSERT_OK_AND_ASSIGN(const Neighbors want, whole->Search(q.view(), {.k = 16, .nprobe = 4}));
    auto grown = Local(dir);
    ASSERT_NE(grown, nullptr);
    ASSERT_OK_AND_ASSIGN(const EngineResult got, grown->Search(testing::FullQuery(q, 16, 4)));
    testing::ExpectSameNeighborsUpToRounding(want, got.neighbors);
    for (size_t i = 0; i < got.neighbors.ids.size(); ++i) {
      EXPECT_EQ(got.neighbors.values[i], Data().values.tokens[got.neighbors.ids[i]]);
    }
    if (!after.subset_quantizer) continue;
    ASSERT_OK_AND_ASSIGN(auto quantizer_file, OpenChecked(dir, *after.subset_quantizer));
    ASSERT_OK_AND_ASSIGN(auto quantizer, SubsetQuantizer::Read(*quantizer_file, 1));
    for (int s = 2; s < 4; ++s) {
      const ShardManifest& shard = after.shards[s];
      ASSERT_OK_AND_ASSIGN(auto codes_file, OpenChecked(dir, *shard.subset_codes));
      ASSERT_OK_AND_ASSIGN(const SubsetCodes codes, ReadSubsetCodes(*codes_file));
      ASSERT_OK_AND_ASSIGN(const Matrix<uint8_t> want_codes,
                           quantizer->Encode({Data().keys.row(shard.id_begin),
                                              shard.id_end - shard.id_begin, kDim}));
      EXPECT_EQ(codes.codes,
                std::vector<uint8_t>(want_codes.data(), want_codes.data() + want_codes.size()));
      EXPECT_EQ(codes.num_sentences(), shard.sentence_end - shard.sentence_begin);
    }
  }
}

}  // namespace
}  // namespace knnserve
