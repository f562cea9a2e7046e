// index_bench: the index layer's benchmarks (issue 3), printed as Markdown tables for
// docs/index.md. Never asserts on time.
//
//   a) full IVFPQ search: queries/s of FaissIndex::Search (our wrapper) vs faiss's own
//      index->search on the same index object, batch 1/16/64/256, k 16/64; and of the same
//      index in serving form (PrepareForServing: lists scanned by IvfAdc with the best
//      quantized kernel), with its recall of faiss's answers;
//   b) subset ADC: codes/s of SubsetAdc vs faiss's PQ distance tables + faiss's scan loop over
//      the same codes (and a full scan vs faiss IndexPQ), with this machine's memory bandwidth
//      measured in the same run; the quantized kernel both packing its subset at every call
//      (a decoding session's first step) and finding it packed (every later step);
//   c) beam sharing: 5 queries sharing one subset vs 1 query.
//
//   index_bench --rows 1000000 --dim 512 --threads 2 [--skip-ivf] [--adc-codes 8000000]
//
//   d) replay (instead of a-c): real decoder states searched in a built index directory through
//      the engine the embedded mode and the shard servers run (CreateLocalEngine), in calls of a
//      decoding step's rows; microseconds per query row, best and median of several passes.
//      Teacher-forced states of the dev set stand in for the decoder's queries:
//
//   knnserve datastore values --corpus dev.tsv --model M --out DEV
//   knnserve datastore keys --out DEV --model M
//   index_bench --replay-index runs/knn-demo/datastore/index --replay-queries DEV/keys.h5 \
//       --replay-rows 20000 --batch 177 --k 32 --nprobe 8 --threads 1
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/bench_timing.h"
#include "common/adc/subset_adc.h"
#include "common/datastore/hdf5_datastore.h"
#include "common/files.h"
#include "common/index/faiss_index.h"
#include "common/index/index_engine.h"
#include "common/process_init.h"
#include "common/progress.h"
#include "common/request.h"
#include "common/wire.h"
#include "faiss/IndexIVF.h"
#include "faiss/IndexPQ.h"
#include "faiss/impl/ProductQuantizer.h"
#include "faiss/utils/Heap.h"

namespace knnserve {
namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}

// Clustered Gaussian data: `clusters` centres, unit noise.
Matrix<float> Clustered(int64_t rows, int dim, int clusters, uint64_t seed) {
  Matrix<float> out(rows, dim);
  std::vector<float> centres(static_cast<size_t>(clusters) * dim);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (float& c : centres) c = 2 * normal(rng);
#pragma omp parallel
  {
    std::mt19937_64 local(seed + 1 + omp_get_thread_num());
    std::normal_distribution<float> n;
    std::uniform_int_distribution<int> pick(0, clusters - 1);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const float* c = centres.data() + static_cast<size_t>(pick(local)) * dim;
      for (int j = 0; j < dim; ++j) out.at(i, j) = c[j] + n(local);
    }
  }
  return out;
}

// Read bandwidth (GB/s) of summing a 1 GiB buffer (far larger than the caches) with `threads`;
// an integer sum, which the compiler vectorises, so the loop is bound by memory, not adds.
double MemoryBandwidth(int threads) {
  const size_t n = size_t{1} << 27;  // 1 GiB of uint64
  std::vector<uint64_t> buf(n);
#pragma omp parallel for num_threads(threads)
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  uint64_t sink = 0;
  const double s = TimeBest(3, [&] {
    uint64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total)
    for (size_t i = 0; i < n; ++i) total += buf[i];
    sink += total;
  });
  if (sink == 42) std::printf(" ");
  return n * sizeof(uint64_t) / s / 1e9;
}

// ---- a) IVFPQ full search -----------------------------------------------------------------------

// The share of `reference`'s neighbours (256 queries) that `other` also returns: the serving
// form sums the same ADC terms in another order, so only near-ties may differ.
double RecallOfReference(const FaissIndex& reference, const FaissIndex& other,
                         const Matrix<float>& queries, const SearchParams& params) {
  const MatrixView<const float> q{queries.data(), 256, queries.cols()};
  auto a = reference.Search(q, params);
  auto b = other.Search(q, params);
  Check(a.status());
  Check(b.status());
  int64_t found = 0, total = 0;
  for (int64_t r = 0; r < q.rows; ++r) {
    const int64_t* ra = a->id_row(r);
    const int64_t* rb = b->id_row(r);
    for (int j = 0; j < params.k; ++j) {
      if (ra[j] < 0) continue;
      ++total;
      found += std::count(rb, rb + params.k, ra[j]);
    }
  }
  return total == 0 ? 1.0 : static_cast<double>(found) / total;
}

void BenchIvfPq(int64_t rows, int dim, int threads, int64_t train_size, const std::string& factory,
                int nprobe) {
  std::fprintf(stderr, "a) generating %lld x %d, training %s on %lld rows...\n",
               static_cast<long long>(rows), dim, factory.c_str(),
               static_cast<long long>(train_size));
  omp_set_num_threads(threads);
  const Matrix<float> data = Clustered(rows, dim, 1000, 1);
  auto index_or = FaissIndex::Create(factory, dim, Metric::kL2, threads);
  Check(index_or.status());
  std::unique_ptr<FaissIndex> index = *std::move(index_or);
  const auto t0 = Clock::now();
  Check(index->Train({data.data(), std::min(rows, train_size), dim}));
  const auto t1 = Clock::now();
  {
    ProgressBar bar("add", rows);
    for (int64_t b = 0; b < rows; b += 65536) {
      const int64_t n = std::min<int64_t>(65536, rows - b);
      Check(index->Add({data.row(b), n, dim}));
      bar.Add(n);
    }
  }
  const auto t2 = Clock::now();
  std::printf("\n### a) IVFPQ full search: %s, %lld x %d, nprobe %d, %d threads\n\n",
              factory.c_str(), static_cast<long long>(rows), dim, nprobe, threads);
  std::printf("train %.1f s on %lld rows; add %.0f vectors/s\n\n", Seconds(t0, t1),
              static_cast<long long>(std::min(rows, train_size)), rows / Seconds(t1, t2));
  // The same index loaded as a shard loads it, in serving form.
  const std::string path = "/tmp/index_bench_ivf.faiss";
  const absl::StatusOr<FileDigest> saved = index->Save(path);
  Check(saved.status());
  auto in = VerifiedFileReader::Open(path, *saved);
  Check(in.status());
  std::remove(path.c_str());  // the open descriptor still reads it
  // Serving form, as shards load it.
  auto loaded = FaissIndex::LoadForServing(**in, threads, BestAdcKernel());
  Check(loaded.status());
  const std::unique_ptr<FaissIndex> serving = *std::move(loaded);
  std::printf("serving form: %s (%s kernel), %.1f bytes per vector\n\n",
              serving->uses_ivf_adc() ? "IvfAdc" : "faiss scan",
              std::string(AdcKernelName(BestAdcKernel())).c_str(),
              serving->InvertedListBytesPerVector());
  std::printf(
      "| k | batch | ours q/s | faiss q/s | ours / faiss | serving q/s | serving / faiss | "
      "serving recall of faiss |\n"
      "|---|---|---|---|---|---|---|---|\n");
  const Matrix<float> queries = Clustered(1024, dim, 1000, 2);
  const faiss::Index& raw = index->faiss_index();
  faiss::SearchParametersIVF ivf;
  ivf.nprobe = nprobe;
  for (int k : {16, 64}) {
    for (int batch : {1, 16, 64, 256}) {
      const int calls = std::max(1, 256 / batch);  // 256 queries per timing
      SearchParams params{k, nprobe, 0};
      std::vector<float> dist(static_cast<size_t>(batch) * k);
      std::vector<faiss::Index::idx_t> ids(dist.size());
      const int64_t total = static_cast<int64_t>(calls) * batch;
      // Interleave the three (3 rounds each) so that load from other processes hits all alike.
      auto time_ours = [&](const FaissIndex& which) {
        return TimeBest(1, [&] {
          for (int c = 0; c < calls; ++c) {
            Check(which.Search({queries.row((c * batch) % 768), batch, dim}, params).status());
          }
        });
      };
      double ours = 1e30, theirs = 1e30, served = 1e30;
      for (int round = 0; round < 3; ++round) {
        ours = std::min(ours, time_ours(*index));
        theirs = std::min(theirs, TimeBest(1, [&] {
                            omp_set_num_threads(threads);
                            for (int c = 0; c < calls; ++c) {
                              raw.search(batch, queries.row((c * batch) % 768), k, dist.data(),
                                         ids.data(), &ivf);
                            }
                          }));
        served = std::min(served, time_ours(*serving));
      }
      std::printf("| %d | %d | %.0f | %.0f | %.3f | %.0f | %.2f | %.4f |\n", k, batch, total / ours,
                  total / theirs, theirs / ours, total / served, theirs / served,
                  RecallOfReference(*index, *serving, queries, params));
      std::fflush(stdout);
    }
  }
}

// ---- b) and c) subset ADC -----------------------------------------------------------------------

struct AdcSetup {
  PqCodebook codebook;
  SubsetCodes codes;
  std::unique_ptr<faiss::ProductQuantizer> pq;  // same centroids, for faiss's tables
};

// Random codebook and codes: ADC speed does not depend on the values.
AdcSetup MakeAdc(int64_t vectors, int dsub, int m) {
  AdcSetup s;
  s.codebook.m = m;
  s.codebook.dsub = dsub;
  s.codebook.centroids.resize(static_cast<size_t>(m) * 256 * dsub);
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal;
  for (float& c : s.codebook.centroids) c = normal(rng);
  s.pq = std::make_unique<faiss::ProductQuantizer>(m * dsub, m, 8);
  s.pq->centroids = s.codebook.centroids;
  s.codes.m = m;
  s.codes.offsets = {0};
  std::uniform_int_distribution<int> len(10, 50);  // sentences of 10..50 tokens (mean 30)
  while (s.codes.offsets.back() < vectors) {
    s.codes.offsets.push_back(std::min<int64_t>(vectors, s.codes.offsets.back() + len(rng)));
  }
  s.codes.codes.resize(static_cast<size_t>(vectors) * m);
#pragma omp parallel
  {
    std::mt19937_64 local(5 + omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t i = 0; i < static_cast<int64_t>(s.codes.codes.size()); i += 8) {
      const uint64_t r = local();
      std::memcpy(&s.codes.codes[i], &r, std::min<size_t>(8, s.codes.codes.size() - i));
    }
  }
  return s;
}

// faiss's PQ distance table + faiss's heap, the generic scan loop faiss's own IndexPQ runs,
// over the ranges of `sentences`; one query.
void FaissSubsetScan(const AdcSetup& s, const float* query, const std::vector<int64_t>& sentences,
                     int k, float* dist, faiss::Index::idx_t* ids) {
  const int m = s.codebook.m;
  std::vector<float> table(static_cast<size_t>(m) * 256);
  s.pq->compute_distance_table(query, table.data());
  faiss::maxheap_heapify(k, dist, ids);
  for (int64_t sentence : sentences) {
    for (int64_t t = s.codes.offsets[sentence]; t < s.codes.offsets[sentence + 1]; ++t) {
      const uint8_t* code = s.codes.codes.data() + t * m;
      float d = 0;
      for (int j = 0; j < m; ++j) d += table[j * 256 + code[j]];
      if (d < dist[0]) faiss::maxheap_replace_top(k, dist, ids, d, t);
    }
  }
  faiss::maxheap_reorder(k, dist, ids);
}

// The fastest exact kernel and, where this CPU has a faster one, the fastest overall.
std::vector<AdcKernel> BenchKernels() {
  const AdcKernel exact = BestExactAdcKernel();
  if (BestAdcKernel() == exact) return {exact};
  return {exact, BestAdcKernel()};
}

// Without a packed-subset cache (cached = false) every timed call packs its subset, as the first
// step of a decoding session does; with one, the timed calls find the subset packed by
// TimeBest's untimed first call, as every later step of a session does.
std::unique_ptr<SubsetAdc> MakeSubsetAdc(const AdcSetup& s, AdcKernel kernel, int threads,
                                         bool cached) {
  SubsetCodes codes = s.codes;                                       // copy: Create takes ownership
  const size_t cache_bytes = cached ? 2 * s.codes.codes.size() : 0;  // room for every subset
  auto adc =
      SubsetAdc::Create(s.codebook, Metric::kL2, std::move(codes), {threads, kernel, cache_bytes});
  Check(adc.status());
  return *std::move(adc);
}

// The kernels to time: each exact one uncached; the quantized one uncached and cached.
std::vector<std::pair<AdcKernel, bool>> BenchVariants() {
  std::vector<std::pair<AdcKernel, bool>> variants;
  for (AdcKernel kernel : BenchKernels()) {
    variants.emplace_back(kernel, false);
    if (IsQuantized(kernel)) variants.emplace_back(kernel, true);
  }
  return variants;
}

std::string VariantName(AdcKernel kernel, bool cached) {
  return std::string(AdcKernelName(kernel)) + (cached ? " (cached)" : "");
}

void BenchAdc(int64_t vectors, int dim, int m, int threads) {
  std::fprintf(stderr, "b) generating %lld codes of %d bytes...\n", static_cast<long long>(vectors),
               m);
  omp_set_num_threads(threads);
  AdcSetup s = MakeAdc(vectors, dim / m, m);
  const int64_t sentences = s.codes.num_sentences();
  const Matrix<float> queries = Clustered(64, dim, 4, 3);
  const double bw1 = MemoryBandwidth(1);
  const double bwn = MemoryBandwidth(threads);
  std::printf(
      "\n### b) subset ADC: M = %d (d %d after transform), %lld codes (%.0f MiB), "
      "sentences of 10..50 tokens, k 64\n\n",
      m, dim, static_cast<long long>(vectors), vectors * m / 1048576.0);
  std::printf(
      "memory read bandwidth (sum over 1 GiB): %.1f GB/s 1 thread, %.1f GB/s %d threads"
      "\n\n",
      bw1, bwn, threads);
  std::printf(
      "| subset | threads | kernel | ours Mcodes/s | faiss Mcodes/s | ours / faiss | ours GB/s "
      "| %% of bandwidth |\n|---|---|---|---|---|---|---|---|\n");
  std::mt19937_64 rng(6);
  for (int64_t subset_sentences : {int64_t{1000}, int64_t{10000}, sentences / 2}) {
    for (int t : {1, threads}) {
      // One group per thread, each a different random subset; one query each.
      SubsetGroups groups(t);
      int64_t subset_codes = 0;
      for (auto& g : groups) {
        std::vector<int64_t> all(sentences);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(subset_sentences);
        std::sort(all.begin(), all.end());
        for (int64_t x : all) subset_codes += s.codes.offsets[x + 1] - s.codes.offsets[x];
        g = std::move(all);
      }
      std::vector<int32_t> row_group(t);
      std::iota(row_group.begin(), row_group.end(), 0);
      const std::shared_ptr<const SubsetGroups> shared = ShareGroups(groups);
      const double theirs = TimeBest(3, [&] {
#pragma omp parallel for num_threads(t)
        for (int g = 0; g < t; ++g) {
          std::vector<float> d(64);
          std::vector<faiss::Index::idx_t> i(64);
          FaissSubsetScan(s, queries.row(g), groups[g], 64, d.data(), i.data());
        }
      });
      for (const auto& [kernel, cached] : BenchVariants()) {
        const std::unique_ptr<SubsetAdc> adc = MakeSubsetAdc(s, kernel, t, cached);
        // TimeBest's untimed first call packs the subsets into the cache.
        const double ours = TimeBest(3, [&] {
          Check(adc->SearchSubset({queries.data(), t, dim}, shared, row_group, 64).status());
        });
        const double ours_rate = subset_codes / ours;
        const double gbs = ours_rate * m / 1e9;
        std::printf(
            "| %lld sentences (%.1f MiB/group) | %d | %s | %.0f | %.0f | %.2f | %.1f | %.0f%% |\n",
            static_cast<long long>(subset_sentences), subset_codes / t * m / 1048576.0, t,
            VariantName(kernel, cached).c_str(), ours_rate / 1e6, subset_codes / theirs / 1e6,
            theirs / ours, gbs, 100 * gbs / (t == 1 ? bw1 : bwn));
        std::fflush(stdout);
      }
    }
  }

  // Full scan of all codes vs faiss IndexPQ::search (its own scan), one thread, 1 query.
  {
    faiss::IndexPQ index(dim, m, 8);
    index.pq.centroids = s.codebook.centroids;
    index.is_trained = true;
    index.codes = s.codes.codes;
    index.ntotal = vectors;
    SubsetGroups groups(1);
    groups[0].resize(sentences);
    std::iota(groups[0].begin(), groups[0].end(), 0);
    const std::shared_ptr<const SubsetGroups> all = ShareGroups(std::move(groups));
    omp_set_num_threads(1);
    std::vector<float> d(64);
    std::vector<faiss::Index::idx_t> i(64);
    const double theirs =
        TimeBest(2, [&] { index.search(1, queries.data(), 64, d.data(), i.data()); });
    std::printf(
        "\nfull scan of all %lld codes, 1 thread, 1 query: faiss IndexPQ::search %.0f "
        "Mcodes/s",
        static_cast<long long>(vectors), vectors / theirs / 1e6);
    for (const auto& [kernel, cached] : BenchVariants()) {
      const std::unique_ptr<SubsetAdc> adc = MakeSubsetAdc(s, kernel, 1, cached);
      const double ours = TimeBest(2, [&] {
        Check(
            adc->SearchSubset({queries.data(), 1, dim}, all, std::vector<int32_t>{0}, 64).status());
      });
      std::printf("; %s %.0f Mcodes/s (%.2fx faiss, %.0f%% of 1-thread bandwidth)",
                  VariantName(kernel, cached).c_str(), vectors / ours / 1e6, theirs / ours,
                  100 * vectors * m / ours / 1e9 / bw1);
    }
    std::printf("\n");
  }

  // c) beam sharing: 5 rows sharing one group vs 1 row, 1 thread.
  std::printf("\n### c) beam sharing (1 thread, k 64): 5 queries sharing a subset vs 1 query\n\n");
  std::printf("| subset | kernel | 1 query ms | 5 queries ms | ratio |\n|---|---|---|---|---|\n");
  for (int64_t subset_sentences : {int64_t{100}, int64_t{1000}, int64_t{10000}}) {
    SubsetGroups group(1);
    group[0].resize(subset_sentences);
    std::vector<int64_t> all(sentences);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::copy(all.begin(), all.begin() + subset_sentences, group[0].begin());
    const std::shared_ptr<const SubsetGroups> shared = ShareGroups(std::move(group));
    for (const auto& [kernel, cached] : BenchVariants()) {
      const std::unique_ptr<SubsetAdc> adc = MakeSubsetAdc(s, kernel, 1, cached);
      const double one = TimeBest(5, [&] {
        Check(adc->SearchSubset({queries.data(), 1, dim}, shared, std::vector<int32_t>{0}, 64)
                  .status());
      });
      const double five = TimeBest(5, [&] {
        Check(adc->SearchSubset({queries.data(), 5, dim}, shared, std::vector<int32_t>(5, 0), 64)
                  .status());
      });
      std::printf("| %lld sentences | %s | %.3f | %.3f | %.2f |\n",
                  static_cast<long long>(subset_sentences), VariantName(kernel, cached).c_str(),
                  one * 1e3, five * 1e3, five / one);
    }
  }
}

struct ReplayOptions {
  std::string index_dir;
  std::string queries;  // keys.h5
  int64_t rows = 20000;
  int batch = 177;  // the demo's query rows per step at batch 64, beam 5
  int k = 32;
  int nprobe = 0;   // --nprobe
  int threads = 1;  // --threads
  int repeats = 5;
};

// The queries of `o`, one validated SearchQuery per call of o.batch rows (as a server or the
// embedded retriever parses a step's request).
std::vector<SearchQuery> ReplayCalls(const ReplayOptions& o, const SearchEngine& engine) {
  absl::StatusOr<std::unique_ptr<Hdf5KeySource>> source = Hdf5KeySource::Open(o.queries);
  Check(source.status());
  const int64_t rows = std::min(o.rows, (*source)->rows());
  if (rows == 0) {
    std::fprintf(stderr, "error: %s holds no rows to replay\n", o.queries.c_str());
    std::exit(1);
  }
  RequestLimits limits;
  limits.max_rows = o.batch;
  SearchParams params;
  params.k = o.k;
  params.nprobe = o.nprobe;
  std::vector<SearchQuery> calls;
  Matrix<float> block(o.batch, (*source)->dim());
  for (int64_t first = 0; first < rows; first += o.batch) {
    const int64_t count = std::min<int64_t>(o.batch, rows - first);
    Check((*source)->Read(first, first + count, block.data()));
    v1::SearchRequest request;
    EncodeSearchRequest(MatrixView<const float>(block.data(), count, block.cols()), v1::DTYPE_FP32,
                        params, &request);
    absl::StatusOr<SearchQuery> query = ParseSearchRequest(request, engine.info().shape(), limits);
    Check(query.status());
    calls.push_back(*std::move(query));
  }
  return calls;
}

void BenchReplay(const ReplayOptions& o) {
  IndexEngineOptions options;
  options.threads = o.threads;
  absl::StatusOr<std::unique_ptr<SearchEngine>> engine = CreateLocalEngine(o.index_dir, options);
  Check(engine.status());
  const std::vector<SearchQuery> calls = ReplayCalls(o, **engine);
  int64_t rows = 0;
  for (const SearchQuery& call : calls) rows += call.queries.rows();
  std::vector<double> seconds;
  for (int r = 0; r <= o.repeats; ++r) {  // pass 0 warms the caches and the scratch
    const auto t0 = Clock::now();
    for (const SearchQuery& call : calls) Check((*engine)->Search(call).status());
    if (r > 0) seconds.push_back(Seconds(t0, Clock::now()));
  }
  std::sort(seconds.begin(), seconds.end());
  const double per_row = 1e6 / static_cast<double>(rows);
  std::printf("\n### d) replay: %lld query rows of %s, %zu calls of up to %d rows\n\n",
              static_cast<long long>(rows), o.queries.c_str(), calls.size(), o.batch);
  std::printf("| index | k | nprobe | threads | best us/row | median us/row | passes |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| %s | %d | %d | %d | %.1f | %.1f | %zu |\n", o.index_dir.c_str(), o.k, o.nprobe,
              o.threads, seconds.front() * per_row, seconds[seconds.size() / 2] * per_row,
              seconds.size());
}

}  // namespace
}  // namespace knnserve

int main(int argc, char** argv) {
  knnserve::InitProcess(argv);
  CLI::App app{"index_bench: IVFPQ wrapper vs faiss, subset ADC vs faiss, beam sharing"};
  int64_t rows = 1000000;
  int dim = 512;
  int threads = 2;
  int64_t train_size = 131072;
  std::string factory = "IVF4096,PQ64";
  int nprobe = 32;
  int64_t adc_codes = 8000000;
  int adc_dim = 256;
  int adc_m = 64;
  bool skip_ivf = false;
  bool skip_adc = false;
  app.add_option("--rows", rows)->capture_default_str();
  app.add_option("--dim", dim)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--train-size", train_size)->capture_default_str();
  app.add_option("--factory", factory)->capture_default_str();
  app.add_option("--nprobe", nprobe)->capture_default_str();
  app.add_option("--adc-codes", adc_codes)->capture_default_str();
  app.add_option("--adc-dim", adc_dim, "dimension after the PCA/OPQ transform")
      ->capture_default_str();
  app.add_option("--adc-m", adc_m)->capture_default_str();
  app.add_flag("--skip-ivf", skip_ivf);
  app.add_flag("--skip-adc", skip_adc);
  knnserve::ReplayOptions replay;
  app.add_option("--replay-index", replay.index_dir,
                 "d) only: search this index directory with --replay-queries");
  app.add_option("--replay-queries", replay.queries, "keys.h5 whose rows are the replayed queries");
  app.add_option("--replay-rows", replay.rows, "first rows of --replay-queries")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch", replay.batch, "replay: query rows per call")
      ->check(CLI::Range(1, knnserve::RequestLimits().max_rows))
      ->capture_default_str();
  app.add_option("--k", replay.k, "replay: neighbours")
      ->check(CLI::Range(1, knnserve::RequestLimits().max_k))
      ->capture_default_str();
  app.add_option("--repeats", replay.repeats, "replay: timed passes over the queries")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (!replay.index_dir.empty() || !replay.queries.empty()) {
    if (replay.index_dir.empty() || replay.queries.empty()) {
      std::fprintf(stderr, "error: --replay-index and --replay-queries go together\n");
      return 1;
    }
    replay.nprobe = nprobe;
    replay.threads = threads;
    knnserve::BenchReplay(replay);
    return 0;
  }
  if (!skip_adc) knnserve::BenchAdc(adc_codes, adc_dim, adc_m, threads);
  if (!skip_ivf) knnserve::BenchIvfPq(rows, dim, threads, train_size, factory, nprobe);
  return 0;
}
