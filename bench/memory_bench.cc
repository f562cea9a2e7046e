// memory_bench: the peak memory of building and of loading one IVF-PQ shard (with its values
// and subset codes) against the memory the loaded shard keeps while serving. Each phase runs in
// a fresh child process (this program re-executed), so that neither inherits the other's heap;
// the child resets its peak (/proc/self/clear_refs) after setting up its inputs and reports
// VmHWM and VmRSS above that baseline. Prints a Markdown table (docs/index.md).
//
//   build/bin/memory_bench --rows 2000000 --dim 128 --factory IVF1024,PQ32
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/random_keys.h"
#include "common/check.h"
#include "common/datastore/key_source.h"
#include "common/index/builder.h"
#include "common/index/index_engine.h"
#include "common/index/manifest.h"
#include "common/process_init.h"

namespace knnserve {
namespace {

struct Flags {
  int64_t rows = 2'000'000;
  int dim = 128;
  std::string factory = "IVF1024,PQ32";
  int64_t train_size = 65536;
  int sentence_tokens = 25;  // tokens per sentence of the synthetic values
  std::string work_dir = "/tmp/knnserve-memory-bench";
  std::string phase;  // set in the children: "build" or "load"
};

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
int64_t StatusBytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stoll(line.substr(field.size() + 1)) * 1024;  // "   1234 kB"
    }
  }
  KNNSERVE_CHECK(false, "no such field in /proc/self/status");
  return 0;
}

// Resets VmHWM to the current RSS (Linux >= 4.0).
void ResetPeak() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";
  KNNSERVE_CHECK(clear_refs.good(), "cannot reset the peak RSS through /proc/self/clear_refs");
}

DatastoreValues SyntheticValues(const Flags& flags) {
  DatastoreValues values;
  values.tokens.resize(flags.rows);
  for (int64_t i = 0; i < flags.rows; ++i) values.tokens[i] = static_cast<int32_t>(i % 32000);
  for (int64_t t = 0; t < flags.rows; t += flags.sentence_tokens) values.offsets.push_back(t);
  values.offsets.push_back(flags.rows);
  return values;
}

std::string IndexDir(const Flags& flags) {
  return absl::StrCat(flags.work_dir, "/", flags.rows, "x", flags.dim, "_", flags.factory);
}

// The child's work; prints "baseline_rss peak_above rss_above" (bytes) on stdout.
void RunPhase(const Flags& flags) {
  const RandomKeySource keys(flags.rows, flags.dim);
  const DatastoreValues values = SyntheticValues(flags);
  const MemoryValueSource value_source(values);
  std::unique_ptr<SearchEngine> engine;  // kept alive until measured
  const int64_t baseline = StatusBytes("VmRSS");
  ResetPeak();
  if (flags.phase == "build") {
    std::filesystem::remove_all(IndexDir(flags));
    IndexBuildOptions options;
    options.factory = flags.factory;
    options.train_size = flags.train_size;
    options.threads = 2;
    absl::StatusOr<IndexManifest> manifest =
        BuildIndex(keys, &value_source, options, IndexDir(flags));
    KNNSERVE_CHECK(manifest.ok(), std::string(manifest.status().message()).c_str());
  } else {
    absl::StatusOr<std::unique_ptr<SearchEngine>> loaded =
        CreateEngine(IndexDir(flags), 0, {.threads = 1});
    KNNSERVE_CHECK(loaded.ok(), std::string(loaded.status().message()).c_str());
    engine = *std::move(loaded);
  }
  std::printf("%lld %lld %lld\n", static_cast<long long>(baseline),
              static_cast<long long>(StatusBytes("VmHWM") - baseline),
              static_cast<long long>(StatusBytes("VmRSS") - baseline));
}

struct Measured {
  double peak_mib = 0;
  double kept_mib = 0;
};

Measured RunChild(const Flags& flags, const std::string& phase) {
  const std::string command = absl::StrCat(
      "/proc/", getpid(), "/exe --phase ", phase, " --rows ", flags.rows, " --dim ", flags.dim,
      " --factory '", flags.factory, "' --train-size ", flags.train_size, " --sentence-tokens ",
      flags.sentence_tokens, " --work-dir '", flags.work_dir, "'");
  FILE* pipe = popen(command.c_str(), "r");
  KNNSERVE_CHECK(pipe != nullptr, "popen failed");
  long long baseline = 0, peak = 0, kept = 0;
  const int fields = std::fscanf(pipe, "%lld %lld %lld", &baseline, &peak, &kept);
  KNNSERVE_CHECK(pclose(pipe) == 0 && fields == 3, "the measuring child failed");
  return {peak / 1048576.0, kept / 1048576.0};
}

double FilesMib(const IndexManifest& manifest) {
  int64_t bytes = 0;
  for (const ShardManifest& shard : manifest.shards) {
    bytes += shard.index.digest.bytes;
    if (shard.values) bytes += shard.values->digest.bytes;
    if (shard.subset_codes) bytes += shard.subset_codes->digest.bytes;
  }
  return bytes / 1048576.0;
}

void Run(const Flags& flags) {
  const Measured build = RunChild(flags, "build");
  const Measured load = RunChild(flags, "load");
  absl::StatusOr<IndexManifest> manifest = ReadManifest(IndexDir(flags));
  KNNSERVE_CHECK(manifest.ok(), std::string(manifest.status().message()).c_str());
  std::printf(
      "\none shard of %lld x %d keys, %s, subset codes of %d-token sentences; MiB above each "
      "child's baseline\n\n",
      static_cast<long long>(flags.rows), flags.dim, flags.factory.c_str(), flags.sentence_tokens);
  std::printf("| shard files MiB | build peak | load peak | serving | load peak / serving |\n");
  std::printf("|---|---|---|---|---|\n");
  std::printf("| %.1f | %.1f | %.1f | %.1f | %.2f |\n", FilesMib(*manifest), build.peak_mib,
              load.peak_mib, load.kept_mib, load.peak_mib / load.kept_mib);
}

}  // namespace
}  // namespace knnserve

int main(int argc, char** argv) {
  knnserve::InitProcess(argv);
  CLI::App app{"memory_bench: peak memory of building and loading a shard vs serving it"};
  knnserve::Flags flags;
  app.add_option("--rows", flags.rows)->capture_default_str();
  app.add_option("--dim", flags.dim)->capture_default_str();
  app.add_option("--factory", flags.factory)->capture_default_str();
  app.add_option("--train-size", flags.train_size)->capture_default_str();
  app.add_option("--sentence-tokens", flags.sentence_tokens)->capture_default_str();
  app.add_option("--work-dir", flags.work_dir)->capture_default_str();
  app.add_option("--phase", flags.phase, "internal: the measuring child's phase")
      ->check(CLI::IsMember({"build", "load"}));
  CLI11_PARSE(app, argc, argv);
  if (flags.phase.empty()) {
    knnserve::Run(flags);
  } else {
    knnserve::RunPhase(flags);
  }
  return 0;
}
