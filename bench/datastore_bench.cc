// datastore_bench: key-computation throughput with length-sorted batches vs corpus-order batches
// over the same sentences and the same token budget, and the padding of each plan. Prints a
// Markdown table (results in docs/datastore.md). Runs the two orders alternately, `repeats`
// times each, and reports the best run of each (noise on shared machines is large).
//
//   datastore_bench --values DIR/values.h5 --model M.pt [--sentences 3000] [--threads 2]
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "common/process_init.h"
#include "client/datastore/feature_extractor.h"
#include "client/datastore/key_computation.h"
#include "common/datastore/batch_plan.h"
#include "common/datastore/values_file.h"

namespace knnserve::datastore {
namespace {

struct Order {
  const char* name;
  std::vector<int64_t> ids;  // sentence ids in processing order
  std::vector<Batch> batches;
  double padding = 0;
  int64_t target_tokens = 0;
  double best_seconds = 1e30;
};

int64_t Len(const DatastoreValues& side, int64_t s) {
  return side.offsets[s + 1] - side.offsets[s];
}

void Plan(const ValuesFile& values, int64_t max_tokens, int64_t max_sentences, Order& order) {
  std::vector<int64_t> lengths, sources, targets;
  for (const int64_t s : order.ids) {
    sources.push_back(Len(values.source, s));
    targets.push_back(Len(values.target, s));
    lengths.push_back(std::max(sources.back(), targets.back()));
    order.target_tokens += targets.back();
  }
  order.batches = PlanBatches(lengths, max_tokens, max_sentences);
  order.padding = PaddingFraction(order.batches, sources, targets);
}

int Run(int argc, char** argv) {
  std::string values_path, model_path;
  int64_t sentences = 3000, max_tokens = 4096, max_sentences = 256;
  int threads = 2, repeats = 2;
  uint64_t seed = 1;
  CLI::App app{"key computation: length-sorted vs corpus-order batches"};
  app.add_option("--values", values_path)->required();
  app.add_option("--model", model_path)->required();
  app.add_option("--sentences", sentences, "random sample of the datastore")->capture_default_str();
  app.add_option("--batch-tokens", max_tokens)->capture_default_str();
  app.add_option("--batch-sentences", max_sentences)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--repeats", repeats)->capture_default_str();
  app.add_option("--seed", seed)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);  // LibTorch defaults to 1 OpenMP thread here

  absl::StatusOr<ValuesFile> values = ReadValuesFile(values_path);
  if (!values.ok()) return std::fprintf(stderr, "%s\n", values.status().ToString().c_str()), 1;
  absl::StatusOr<LoadedExtractor> loaded =
      LoadTransformerExtractor(model_path, kFeatureDecoderOut, "cpu");
  if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str()), 1;

  std::vector<int64_t> sample(values->num_sentences());
  std::iota(sample.begin(), sample.end(), 0);
  std::shuffle(sample.begin(), sample.end(), std::mt19937_64(seed));
  sample.resize(std::min<int64_t>(sentences, values->num_sentences()));
  Order sorted{"length-sorted (stored order)", sample};
  std::sort(sorted.ids.begin(), sorted.ids.end());  // stored order is length-sorted
  Order corpus{"corpus order", sample};
  std::sort(corpus.ids.begin(), corpus.ids.end(),
            [&](int64_t a, int64_t b) { return values->order[a] < values->order[b]; });
  for (Order* o : {&sorted, &corpus}) Plan(*values, max_tokens, max_sentences, *o);

  for (int r = 0; r < repeats; ++r) {
    for (Order* o : {&sorted, &corpus}) {
      const absl::Time begin = absl::Now();
      for (const Batch& b : o->batches) {
        const SentenceBatch batch =
            BatchOf(values->source, values->target,
                    absl::Span<const int64_t>(o->ids).subspan(b.begin, b.end - b.begin));
        absl::StatusOr<Matrix<float>> features = loaded->extractor->TokenFeatures(batch);
        if (!features.ok())
          return std::fprintf(stderr, "%s\n", features.status().ToString().c_str()), 1;
      }
      o->best_seconds = std::min(o->best_seconds, absl::ToDoubleSeconds(absl::Now() - begin));
    }
  }
  std::printf(
      "%lld sentences, %lld target tokens, batch budget %lld tokens / %lld sentences, "
      "%d threads, best of %d\n\n",
      static_cast<long long>(sample.size()), static_cast<long long>(sorted.target_tokens),
      static_cast<long long>(max_tokens), static_cast<long long>(max_sentences), threads, repeats);
  std::printf("| order | batches | padding | seconds | keys/s |\n|---|---|---|---|---|\n");
  for (const Order* o : {&sorted, &corpus}) {
    std::printf("| %s | %zu | %.1f%% | %.2f | %.0f |\n", o->name, o->batches.size(),
                100 * o->padding, o->best_seconds, o->target_tokens / o->best_seconds);
  }
  std::printf("\nspeed-up of length-sorted batches: %.2fx\n",
              corpus.best_seconds / sorted.best_seconds);
  return 0;
}

}  // namespace
}  // namespace knnserve::datastore

int main(int argc, char** argv) {
  knnserve::InitProcess(argv);
  return knnserve::datastore::Run(argc, argv);
}
