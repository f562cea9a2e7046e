// adc_cuda_bench: subset ADC on the GPU (CudaSubsetAdc) vs the CPU engine (SubsetAdc, fastest
// kernel, packed-subset cache on as in decoding) on the same random codes, for subset kNN-MT's
// shapes: beams of 5 rows, 1 or many beams per call, subsets of 512 sentences up to all codes.
// Prints a Markdown table (docs/index.md); never asserts a time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "bench/bench_timing.h"
#include "common/adc/cuda/cuda_subset_adc.h"
#include "common/adc/subset_adc.h"

namespace knnserve {
namespace {

template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(v);
}

struct Scenario {
  int groups;         // beams per call
  int64_t sentences;  // per group; <= 0: all
};

void Run(int64_t tokens, int m, int dsub, int k, int reps) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  PqCodebook codebook{m, dsub, std::vector<float>(static_cast<size_t>(m) * 256 * dsub)};
  for (float& c : codebook.centroids) c = normal(rng);
  SubsetCodes codes{m, 0, 0, {0}, {}};
  while (codes.offsets.back() < tokens)
    codes.offsets.push_back(codes.offsets.back() + 1 + rng() % 30);
  codes.codes.resize(codes.offsets.back() * m);
  for (size_t i = 0; i < codes.codes.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(codes.codes.data() + i, &r, std::min<size_t>(8, codes.codes.size() - i));
  }
  const int64_t num_sentences = codes.num_sentences();
  const int64_t num_tokens = codes.num_vectors();
  SubsetAdc::Options options;
  options.threads = static_cast<int>(std::thread::hardware_concurrency());
  std::shared_ptr<const SubsetAdc> cpu =
      Value(SubsetAdc::Create(codebook, Metric::kL2, std::move(codes), options));
  std::unique_ptr<CudaSubsetAdc> gpu = Value(CudaSubsetAdc::Create(cpu));

  std::printf("device: %s; CPU: %u threads, kernel %s\n", cuda::DeviceDescription().c_str(),
              std::thread::hardware_concurrency(),
              std::string(AdcKernelName(cpu->kernel())).c_str());
  std::printf(
      "%lld codes of %d bytes (%lld sentences), dim %d, k %d, 5 rows per beam, best of %d\n\n",
      static_cast<long long>(num_tokens), m, static_cast<long long>(num_sentences), codebook.dim(),
      k, reps);
  std::printf(
      "| beams | sentences per beam | codes per call | CPU ms | GPU ms | GPU / CPU speed | GPU "
      "codes GB/s | same ids |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (Scenario s : {Scenario{1, 512}, Scenario{16, 512}, Scenario{64, 512}, Scenario{1, 16384},
                     Scenario{64, 4096}, Scenario{1, 0}}) {
    const int64_t per_group = s.sentences <= 0 ? num_sentences : s.sentences;
    SubsetGroups groups(s.groups);
    std::vector<int32_t> row_group;
    for (int g = 0; g < s.groups; ++g) {
      if (per_group == num_sentences) {
        groups[g].resize(num_sentences);
        for (int64_t i = 0; i < num_sentences; ++i) groups[g][i] = i;
      } else {
        std::vector<int64_t>& group = groups[g];
        while (static_cast<int64_t>(group.size()) < per_group) {
          group.push_back(rng() % num_sentences);
          if (group.size() % 1024 == 0 || static_cast<int64_t>(group.size()) == per_group) {
            std::sort(group.begin(), group.end());
            group.erase(std::unique(group.begin(), group.end()), group.end());
          }
        }
      }
      for (int r = 0; r < 5; ++r) row_group.push_back(g);
    }
    std::vector<float> queries(row_group.size() * codebook.dim());
    for (float& x : queries) x = normal(rng);
    const MatrixView<const float> view{queries.data(), static_cast<int64_t>(row_group.size()),
                                       codebook.dim()};
    SubsetResult cpu_result, gpu_result;
    const std::shared_ptr<const SubsetGroups> shared = ShareGroups(groups);
    const double cpu_s =
        TimeBest(reps, [&] { cpu_result = Value(cpu->SearchSubset(view, shared, row_group, k)); });
    const double gpu_s =
        TimeBest(reps, [&] { gpu_result = Value(gpu->SearchSubset(view, shared, row_group, k)); });
    const int64_t scanned = gpu_result.vectors_scanned;
    std::printf("| %d | %lld | %lld | %.3f | %.3f | %.2f | %.1f | %s |\n", s.groups,
                static_cast<long long>(per_group), static_cast<long long>(scanned), cpu_s * 1e3,
                gpu_s * 1e3, cpu_s / gpu_s, scanned * m / gpu_s / 1e9,
                cpu_result.neighbors.ids == gpu_result.neighbors.ids ? "yes" : "NO");
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace knnserve

int main(int argc, char** argv) {
  CLI::App app{"adc_cuda_bench: subset ADC on the GPU vs the CPU engine"};
  int64_t tokens = 4000000;
  int m = 64, dsub = 4, k = 64, reps = 5;
  app.add_option("--tokens", tokens)->capture_default_str();
  app.add_option("--m", m)->capture_default_str();
  app.add_option("--dsub", dsub)->capture_default_str();
  app.add_option("--k", k)->capture_default_str();
  app.add_option("--reps", reps)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  knnserve::Run(tokens, m, dsub, k, reps);
  return 0;
}
