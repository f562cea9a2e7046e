// `knnserve index build|add|search|info`: build a sharded index directory from a datastore's
// HDF5 files, grow it by new shards, query it ad hoc, print its manifest. Torch-free: only the
// index layer (common/).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/cli/commands.h"
#include "common/cli_checks.h"
#include "common/datastore/hdf5_datastore.h"
#include "common/files.h"
#include "common/index/builder.h"
#include "common/index/faiss_index.h"
#include "common/index/index_engine.h"
#include "common/index/manifest.h"
#include "common/request.h"
#include "common/status_macros.h"
#include "common/wire.h"

namespace knnserve::cli {
namespace {

Metric ParseMetric(const std::string& name) {
  if (name == "l2" || name == "L2") return Metric::kL2;
  if (name == "ip" || name == "inner_product") return Metric::kInnerProduct;
  ExitOnError(
      absl::InvalidArgumentError(absl::StrCat("--metric must be l2 or ip, got \"", name, "\"")));
  return Metric::kL2;
}

struct BuildFlags {
  std::string keys;
  std::string values;
  std::string out;
  std::string metric = "l2";
  IndexBuildOptions options;
};

// A datastore's keys and, when `values_path` is set, its values (streamed: only the offsets
// stay in memory), checked to belong together.
struct KeysAndValues {
  std::unique_ptr<Hdf5KeySource> keys;
  std::unique_ptr<Hdf5ValueSource> values;
};

KeysAndValues OpenKeysAndValues(const std::string& keys_path, const std::string& values_path) {
  KeysAndValues in;
  in.keys = ValueOrExit(Hdf5KeySource::Open(keys_path));
  if (values_path.empty()) return in;
  in.values = ValueOrExit(Hdf5ValueSource::Open(values_path));
  if (in.values->num_tokens() != in.keys->rows()) {
    ExitOnError(absl::InvalidArgumentError(
        absl::StrCat(values_path, " holds ", in.values->num_tokens(), " target tokens, ", keys_path,
                     " holds ", in.keys->rows(),
                     " keys: a key per token is needed (sentence keys "
                     "given for token keys?)")));
  }
  // Equal token counts do not make them the keys' values: the same corpus tokenized twice
  // differently, or shuffled, has as many tokens in another order.
  if (!in.keys->values_sha256().empty()) {
    const FileDigest digest = ValueOrExit(DigestFile(values_path));
    if (digest.sha256 != in.keys->values_sha256()) {
      ExitOnError(absl::FailedPreconditionError(absl::StrCat(
          keys_path, " was computed from a values.h5 of sha256 ", in.keys->values_sha256(), "; ",
          values_path, " has sha256 ", digest.sha256, ": the neighbours would get other tokens")));
    }
  }
  return in;
}

void RunBuild(BuildFlags& f) {
  f.options.metric = ParseMetric(f.metric);
  const KeysAndValues in = OpenKeysAndValues(f.keys, f.values);
  std::fprintf(stderr, "index build: %lld keys of dimension %d (%s) -> %s, \"%s\", %d shards\n",
               static_cast<long long>(in.keys->rows()), in.keys->dim(),
               in.keys->is_fp16() ? "float16" : "float32", f.out.c_str(), f.options.factory.c_str(),
               f.options.shards);
  const IndexManifest manifest =
      ValueOrExit(BuildIndex(*in.keys, in.values.get(), f.options, f.out));
  std::printf("%s", manifest.ToJson().c_str());
}

struct AddFlags {
  std::string dir;
  std::string keys;
  std::string values;
  IndexAddOptions options;
};

void RunAdd(const AddFlags& f) {
  const KeysAndValues in = OpenKeysAndValues(f.keys, f.values);
  std::fprintf(stderr, "index add: %s (%lld keys of dimension %d) -> %s, %d new shards\n",
               f.keys.c_str(), static_cast<long long>(in.keys->rows()), in.keys->dim(),
               f.dir.c_str(), f.options.shards);
  const IndexManifest manifest =
      ValueOrExit(AddToIndex(*in.keys, in.values.get(), f.options, f.dir));
  std::printf("%s", manifest.ToJson().c_str());
}

struct SearchFlags {
  std::string dir;
  std::string queries;
  int64_t rows = 10;
  int batch = RequestLimits().max_rows;  // rows per search call
  int shard = -1;                        // -1: all shards merged
  std::string subset;
  bool subset_given = false;  // --subset "" is an empty subset, not a full search
  IndexEngineOptions engine;
  SearchParams params;
};

// "3,17,42" -> sentence ids.
std::vector<int64_t> ParseSentences(const std::string& text) {
  std::vector<int64_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      ExitOnError(absl::InvalidArgumentError(
          absl::StrCat("--subset: \"", part, "\" is not a sentence id")));
    }
    ids.push_back(id);
  }
  return ids;
}

// One line per neighbour of each query row, numbered from `first_row`.
void PrintNeighbors(const Neighbors& n, int64_t first_row) {
  for (int64_t r = 0; r < n.rows; ++r) {
    std::printf("query %lld\n", static_cast<long long>(first_row + r));
    for (int j = 0; j < n.k; ++j) {
      const int64_t i = r * n.k + j;
      if (n.ids[i] < 0) break;
      std::printf("  %d %lld %d %.6g\n", j, static_cast<long long>(n.ids[i]),
                  n.has_values() ? n.values[i] : -1, n.distances[i]);
    }
  }
}

// A search parameter the search would not use is refused rather than ignored: a user who
// set it expects it to change the answer. Asked of an empty index of the manifest's factory,
// before the shards are loaded.
absl::Status CheckParamsApply(const SearchFlags& f) {
  ASSIGN_OR_RETURN(const IndexManifest manifest, ReadManifest(f.dir));
  ASSIGN_OR_RETURN(const std::unique_ptr<FaissIndex> empty,
                   FaissIndex::Create(manifest.factory, manifest.dim, manifest.metric, 1));
  const FaissIndex::UsedParams used = empty->used_params();
  const auto refuse = [&](absl::string_view flag, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the index in ", f.dir, " (\"", manifest.factory, "\") ", what));
  };
  if (f.subset_given && (f.params.nprobe > 0 || f.params.ef_search > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.params.nprobe > 0 ? "--nprobe" : "--ef-search",
                     ": a --subset search scans its sentences' codes, it probes no lists"));
  }
  if (f.params.nprobe > 0 && !used.nprobe) return refuse("--nprobe", "has no IVF lists to probe");
  if (f.params.ef_search > 0 && !used.ef_search) {
    return refuse("--ef-search", "has no HNSW graph");
  }
  return absl::OkStatus();
}

void RunSearch(const SearchFlags& f) {
  ExitOnError(CheckParamsApply(f));
  std::unique_ptr<SearchEngine> engine = ValueOrExit(
      f.shard < 0 ? CreateLocalEngine(f.dir, f.engine) : CreateEngine(f.dir, f.shard, f.engine));
  std::unique_ptr<Hdf5KeySource> source = ValueOrExit(Hdf5KeySource::Open(f.queries));
  const int64_t rows = std::min(f.rows, source->rows());
  const std::vector<int64_t> subset =
      f.subset_given ? ParseSentences(f.subset) : std::vector<int64_t>();
  // Limits sized to this call: the checks a server makes, not its budget.
  RequestLimits limits;
  limits.max_k = f.params.k;
  limits.max_subset_sentences = limits.max_total_subset_sentences =
      std::max<int64_t>(1, engine->info().num_sentences);
  // Searched and printed f.batch rows at a time: the results of all rows at once (rows x k
  // neighbours) need not fit in memory.
  limits.max_rows = f.batch;
  Matrix<float> queries(std::min<int64_t>(rows, f.batch), source->dim());
  std::printf("# %lld queries, k %d; per query: rank id value distance\n",
              static_cast<long long>(rows), f.params.k);
  int64_t vectors_searched = 0;
  for (int64_t first = 0; first < rows; first += f.batch) {
    const int64_t count = std::min<int64_t>(f.batch, rows - first);
    ExitOnError(source->Read(first, first + count, queries.data()));
    // Checked as a server checks a request: dimension, finite values, k, ids of the subset.
    v1::SearchRequest request;
    EncodeSearchRequest(MatrixView<const float>(queries.data(), count, queries.cols()),
                        v1::DTYPE_FP32, f.params, &request);
    if (f.subset_given) {
      request.add_subset_groups()->mutable_sentence_ids()->Assign(subset.begin(), subset.end());
      for (int64_t r = 0; r < count; ++r) request.add_row_group(0);
    }
    const SearchQuery query =
        ValueOrExit(ParseSearchRequest(request, engine->info().shape(), limits));
    const EngineResult result = ValueOrExit(engine->Search(query));
    vectors_searched += result.vectors_searched;
    PrintNeighbors(result.neighbors, first);
  }
  std::printf("# %lld vectors searched\n", static_cast<long long>(vectors_searched));
}

void RunInfo(const std::string& dir) {
  const IndexManifest manifest = ValueOrExit(ReadManifest(dir));
  std::printf("%s", manifest.ToJson().c_str());
}

}  // namespace

void RegisterIndexCommands(CLI::App& app) {
  CLI::App* index = app.add_subcommand("index", "Build, query and inspect sharded indexes");
  index->require_subcommand(1);

  auto build = std::make_shared<BuildFlags>();
  CLI::App* b = index->add_subcommand("build", "Build a sharded index directory from keys.h5");
  b->add_option("--keys", build->keys, "keys.h5 (/keys float16 or float32 [N, d])")->required();
  b->add_option("--values", build->values,
                "values.h5 (/tokens, /offsets): shards carry values and subset codes");
  b->add_option("--factory", build->options.factory, "faiss index_factory string")
      ->capture_default_str();
  b->add_option("--shards", build->options.shards, "shards (contiguous id ranges)")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  b->add_option("--out", build->out, "output directory")->required();
  b->add_option("--train-size", build->options.train_size, "rows sampled for training")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  b->add_option("--threads", build->options.threads, "OpenMP threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  b->add_option("--metric", build->metric, "l2 or ip")->capture_default_str();
  b->add_option("--subset-m", build->options.subset_m,
                "subset PQ sub-quantizers (0: the index's PQ M)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  b->add_option("--opq-iterations", build->options.opq_iterations,
                "OPQ training iterations (0: faiss default)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  b->add_option("--chunk-rows", build->options.chunk_rows, "rows read and added per step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  b->add_option("--seed", build->options.seed, "training sample seed")
      ->check(CLI::NonNegativeNumber)  // a uint64: "-1" would wrap to 2^64 - 1
      ->capture_default_str();
  b->callback([build] { RunBuild(*build); });

  auto add = std::make_shared<AddFlags>();
  CLI::App* a = index->add_subcommand(
      "add", "Add the rows appended to a datastore's keys.h5 to its index, as new shards");
  a->add_option("dir", add->dir, "index directory (knnserve index build --out)")->required();
  a->add_option("--keys", add->keys,
                "keys.h5 whose first rows are the index's; the rows after them are added")
      ->required();
  a->add_option("--values", add->values,
                "values.h5 grown likewise (required when the index carries values)");
  a->add_option("--shards", add->options.shards, "new shards (contiguous id ranges)")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  a->add_option("--threads", add->options.threads, "OpenMP threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  a->add_option("--chunk-rows", add->options.chunk_rows, "rows read and added per step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  a->callback([add] { RunAdd(*add); });

  auto search = std::make_shared<SearchFlags>();
  CLI::App* s = index->add_subcommand("search", "Query an index directory with rows of an HDF5");
  s->add_option("dir", search->dir, "index directory")->required();
  s->add_option("--queries", search->queries, "HDF5 file with /keys [n, d] (e.g. keys.h5)")
      ->required();
  s->add_option("--rows", search->rows, "first rows of --queries to search")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  s->add_option("--batch", search->batch, "rows per search call")
      ->check(CLI::Range(1, RequestLimits().max_rows))
      ->capture_default_str();
  s->add_option("--k", search->params.k, "neighbours")
      ->check(CLI::Range(1, RequestLimits().max_k))
      ->capture_default_str();
  s->add_option("--nprobe", search->params.nprobe, "IVF lists probed (0: index default)")
      ->check(CLI::Range(0, RequestLimits().max_nprobe))
      ->capture_default_str();
  s->add_option("--ef-search", search->params.ef_search, "HNSW efSearch (0: index default)")
      ->check(CLI::Range(0, RequestLimits().max_ef_search))
      ->capture_default_str();
  s->add_option("--shard", search->shard, "one shard only (-1: all, merged)")
      ->check(CLI::Range(-1, 1 << 16))
      ->capture_default_str();
  CLI::Option* subset =
      s->add_option("--subset", search->subset, "comma-separated sentence ids: subset search");
  s->add_option("--threads", search->engine.threads, "OpenMP threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  s->callback([search, subset] {
    search->subset_given = subset->count() > 0;
    RunSearch(*search);
  });

  auto dir = std::make_shared<std::string>();
  CLI::App* i = index->add_subcommand("info", "Print an index directory's manifest");
  i->add_option("dir", *dir, "index directory")->required();
  i->callback([dir] { RunInfo(*dir); });
}

}  // namespace knnserve::cli
