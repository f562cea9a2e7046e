#include "client/datastore/pipeline.h"

#include <filesystem>
#include <functional>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/model/checkpoint.h"
#include "common/datastore/datastore_manifest.h"
#include "common/datastore/hdf5_datastore.h"
#include "common/datastore/values_file.h"
#include "common/files.h"
#include "common/index/manifest.h"
#include "common/status_macros.h"

namespace knnserve::datastore {
namespace {

namespace fs = std::filesystem;

constexpr char kModelInput[] = "model_sha256";
constexpr char kFeatureInput[] = "feature";  // the keys' feature (absent before it was recorded)

std::string Join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// Size of an index directory, or an error when any file its manifest lists fails to verify.
absl::StatusOr<int64_t> VerifyIndexDirectory(const std::string& dir) {
  ASSIGN_OR_RETURN(const IndexManifest manifest, ReadManifest(dir));
  std::vector<ManifestFile> files;
  if (manifest.subset_quantizer) files.push_back(*manifest.subset_quantizer);
  for (const ShardManifest& shard : manifest.shards) {
    files.push_back(shard.index);
    if (shard.values) files.push_back(*shard.values);
    if (shard.subset_codes) files.push_back(*shard.subset_codes);
  }
  int64_t bytes = 0;
  for (const ManifestFile& f : files) {
    RETURN_IF_ERROR(VerifyFile(Join(dir, f.file), f.digest));
    bytes += f.digest.bytes;
  }
  return bytes;
}

// Runs the steps in order, recording each in datastore.json.
class Pipeline {
 public:
  Pipeline(const BuildOptions& options, DatastoreManifest manifest)
      : options_(options), manifest_(std::move(manifest)) {}

  // A step producing the file `output` (relative to the directory). `verify` checks an existing
  // output beyond its digest and returns its size; `run` computes it and returns a detail line.
  absl::Status Step(const std::string& name, const std::string& output,
                    const std::function<absl::StatusOr<std::string>()>& run,
                    const std::function<absl::StatusOr<int64_t>()>& verify = nullptr) {
    StepResult result;
    result.step = name;
    const std::string path = Join(options_.out_dir, output);
    const bool recorded = manifest_.steps.count(name) > 0;
    const bool stale_inputs = upstream_changed_;
    if (!stale_inputs && recorded && manifest_.steps[name].file == output &&
        VerifyFile(path, manifest_.steps[name].digest).ok()) {
      absl::StatusOr<int64_t> bytes =
          verify ? verify() : absl::StatusOr<int64_t>(manifest_.steps[name].digest.bytes);
      if (bytes.ok()) {
        result.skipped = true;
        result.bytes = *bytes;
        result.detail = "complete and verified";
        std::fprintf(stderr, "datastore build: %s: complete and verified, skipped\n", name.c_str());
        results_.push_back(result);
        return absl::OkStatus();
      }
    }
    // Recomputing: this step's and every later step's recorded outputs are stale. An output we
    // recorded that no longer verifies, or one made from stale inputs, is removed first so the
    // step cannot adopt it; a partial output is kept (resumed) unless its inputs changed.
    upstream_changed_ = true;
    manifest_.steps.erase(name);
    std::error_code ignored;
    if (recorded || stale_inputs) fs::remove(path, ignored);
    if (stale_inputs) fs::remove(PartialPath(path), ignored);
    const absl::Time begin = absl::Now();
    ASSIGN_OR_RETURN(result.detail, run());
    result.seconds = absl::ToDoubleSeconds(absl::Now() - begin);
    ASSIGN_OR_RETURN(const FileDigest digest, DigestFile(path));
    if (verify) {
      ASSIGN_OR_RETURN(result.bytes, verify());
    } else {
      result.bytes = digest.bytes;
    }
    manifest_.steps[name] = ManifestFile{output, digest};
    RETURN_IF_ERROR(WriteDatastoreManifest(options_.out_dir, manifest_));
    std::fprintf(stderr, "datastore build: %s: %.1f s, %s\n", name.c_str(), result.seconds,
                 result.detail.c_str());
    results_.push_back(result);
    return absl::OkStatus();
  }

  std::vector<StepResult> results() const { return results_; }

 private:
  const BuildOptions& options_;
  DatastoreManifest manifest_;
  bool upstream_changed_ = false;
  std::vector<StepResult> results_;
};

std::string KeysDetail(const KeysReport& r) {
  return absl::StrFormat("%d x %d keys, %.0f rows/s, padding %.1f%%, resumed from row %d", r.rows,
                         r.dim, r.rows_per_second, 100 * r.padding_fraction, r.resumed_from);
}

// An index of the keys at `keys_path`, with the target values of `values_path` unless that is
// empty. The target tokens are streamed from values.h5 (TargetValueSource): only the offsets and
// /order of every sentence are in memory, never the tokens of the corpus.
absl::StatusOr<std::string> RunIndex(const std::string& keys_path, const std::string& values_path,
                                     const IndexBuildOptions& options, const std::string& dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<Hdf5KeySource> keys, Hdf5KeySource::Open(keys_path));
  std::unique_ptr<ValuesReader> values;
  std::optional<TargetValueSource> target;
  if (!values_path.empty()) {
    ASSIGN_OR_RETURN(values, ValuesReader::Open(values_path));
    target.emplace(*values);
  }
  ASSIGN_OR_RETURN(const IndexManifest manifest,
                   BuildIndex(*keys, target ? &*target : nullptr, options, dir));
  return absl::StrCat(
      options.factory, ", ", manifest.total_vectors, " vectors, ", manifest.shards.size(),
      " shards",
      manifest.subset_m > 0 ? absl::StrCat(", subset codes M=", manifest.subset_m) : std::string());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& tokenizer_path,
                                                         const std::string& model_path) {
  if (!tokenizer_path.empty()) return Tokenizer::Load(tokenizer_path);
  ASSIGN_OR_RETURN(model::LoadedModel loaded, model::LoadCheckpoint(model_path));
  if (loaded.tokenizer.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, " embeds no tokenizer: pass --tokenizer"));
  }
  return Tokenizer::FromSerialized(std::move(loaded.tokenizer));
}

absl::StatusOr<ValuesReport> RunValuesStep(const Tokenizer& tokenizer, ValuesBuildOptions options) {
  options.tokenizer.vocab_size = tokenizer.vocab_size();
  options.tokenizer.bos_id = tokenizer.bos_id();
  options.tokenizer.pad_id = tokenizer.pad_id();
  options.tokenizer.eos_id = tokenizer.eos_id();
  options.tokenizer.unk_id = tokenizer.unk_id();
  options.tokenizer.sha256 = Sha256Hex(tokenizer.serialized());
  return BuildValues(options,
                     [&tokenizer](absl::string_view text) { return tokenizer.Encode(text); });
}

absl::StatusOr<std::vector<StepResult>> BuildDatastore(const BuildOptions& options) {
  std::error_code error;
  fs::create_directories(options.out_dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", options.out_dir, ": ", error.message()));
  }
  ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tokenizer,
                   LoadTokenizer(options.tokenizer_path, options.model_path));
  ASSIGN_OR_RETURN(const FileDigest corpus, DigestFile(options.corpus_path));
  ASSIGN_OR_RETURN(const FileDigest model, DigestFile(options.model_path));
  const std::map<std::string, std::string> inputs = {
      {"corpus_sha256", corpus.sha256},
      {"tokenizer_sha256", Sha256Hex(tokenizer->serialized())},
      {kModelInput, model.sha256},
      {kFeatureInput, options.feature}};
  ASSIGN_OR_RETURN(std::optional<DatastoreManifest> existing,
                   ReadDatastoreManifest(options.out_dir));
  DatastoreManifest manifest = existing ? *existing : DatastoreManifest();
  RETURN_IF_ERROR(CheckInputs(manifest, inputs, options.out_dir));
  manifest.inputs = inputs;
  Pipeline pipeline(options, std::move(manifest));

  const std::string values_path = Join(options.out_dir, kValuesFileName);
  RETURN_IF_ERROR(pipeline.Step("values", kValuesFileName, [&]() -> absl::StatusOr<std::string> {
    ValuesBuildOptions values;
    values.corpus_path = options.corpus_path;
    values.out_path = values_path;
    values.max_tokens = options.max_sentence_tokens;
    values.strict = options.strict;
    values.threads = options.threads;
    ASSIGN_OR_RETURN(const ValuesReport r, RunValuesStep(*tokenizer, values));
    return absl::StrCat(r.sentences, " sentences, ", r.target_tokens, " target tokens, ",
                        r.bad.Summary());
  }));

  for (const KeyKind kind : {KeyKind::kTokens, KeyKind::kSentences}) {
    const bool tokens = kind == KeyKind::kTokens;
    const std::string file = tokens ? kKeysFileName : kSentenceKeysFileName;
    RETURN_IF_ERROR(pipeline.Step(tokens ? "keys" : "sentence_keys", file,
                                  [&]() -> absl::StatusOr<std::string> {
                                    KeysStepOptions step;
                                    step.values_path = values_path;
                                    step.model_path = options.model_path;
                                    step.out_path = Join(options.out_dir, file);
                                    step.feature = options.feature;
                                    step.device = options.device;
                                    step.threads = options.threads;
                                    step.keys = options.keys;
                                    step.keys.kind = kind;
                                    ASSIGN_OR_RETURN(const KeysReport r, RunKeysStep(step));
                                    return KeysDetail(r);
                                  }));
  }

  for (const bool sentences : {false, true}) {
    const std::string dir_name = sentences ? kSentenceIndexDirName : kIndexDirName;
    const std::string dir = Join(options.out_dir, dir_name);
    IndexBuildOptions index = options.index;
    index.threads = options.threads;
    if (sentences) {
      index.factory = options.sentence_factory;
      index.shards = 1;
    }
    RETURN_IF_ERROR(pipeline.Step(
        sentences ? "sentence_index" : "index", Join(dir_name, kManifestFileName),
        [&]() -> absl::StatusOr<std::string> {
          return RunIndex(Join(options.out_dir, sentences ? kSentenceKeysFileName : kKeysFileName),
                          sentences ? std::string() : values_path, index, dir);
        },
        [&] { return VerifyIndexDirectory(dir); }));
  }
  return pipeline.results();
}

absl::Status CheckDatastoreForDecoding(const std::string& dir, const std::string& model_path) {
  ASSIGN_OR_RETURN(const std::optional<DatastoreManifest> manifest, ReadDatastoreManifest(dir));
  if (!manifest.has_value()) return absl::OkStatus();
  const auto recorded = [&](const char* name) -> std::string {
    auto it = manifest->inputs.find(name);
    return it == manifest->inputs.end() ? "" : it->second;
  };
  const std::string feature = recorded(kFeatureInput);
  if (!feature.empty() && feature != kFeatureDecoderOut) {
    return absl::FailedPreconditionError(
        absl::StrCat("datastore ", dir, " has ", feature, " keys; the kNN-MT decoder queries with ",
                     kFeatureDecoderOut, " (rebuild it with --feature ", kFeatureDecoderOut, ")"));
  }
  ASSIGN_OR_RETURN(const FileDigest model, DigestFile(model_path));
  const std::string built_with = recorded(kModelInput);
  if (!built_with.empty() && built_with != model.sha256) {
    return absl::FailedPreconditionError(
        absl::StrCat("datastore ", dir, " was built with the model of SHA-256 ", built_with,
                     ", not ", model_path, " (", model.sha256,
                     "): its keys do not match this model's features; "
                     "translate with that model or rebuild the datastore"));
  }
  return absl::OkStatus();
}

}  // namespace knnserve::datastore
