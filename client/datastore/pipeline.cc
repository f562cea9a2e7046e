#include "client/datastore/pipeline.h"

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>

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
  int64_t bytes = 0;
  for (const ManifestFile& f : manifest.Files()) {
    RETURN_IF_ERROR(VerifyFile(Join(dir, f.file), f.digest));
    bytes += f.digest.bytes;
  }
  return bytes;
}

// One step of the pipeline: it produces the file `output` (relative to the directory).
struct StepSpec {
  std::string name;
  std::string output;
  // The options that shape the output (recorded; a recorded output made with others is rebuilt).
  std::string options;
  // Computes the output and returns a detail line.
  std::function<absl::StatusOr<std::string>()> run;
  // Checks an existing output beyond its digest and returns its size (null: the digest's).
  std::function<absl::StatusOr<int64_t>()> verify;
  // The step takes over an output it finds unrecorded when it checks out (the keys steps:
  // keys of the same values, model and dtype), and resumes a partial one.
  bool adopts_output = false;
  // Removes an output that may not stand (null: removes the file `output`).
  std::function<void()> remove_output;
};

// Runs the steps in order, recording each in datastore.json.
class Pipeline {
 public:
  Pipeline(const BuildOptions& options, DatastoreManifest manifest)
      : options_(options), manifest_(std::move(manifest)) {}

  absl::Status Step(const StepSpec& step) {
    StepResult result;
    result.step = step.name;
    const std::string& name = step.name;
    const std::string path = Join(options_.out_dir, step.output);
    const auto record = manifest_.steps.find(name);
    const bool recorded = record != manifest_.steps.end();
    // What the recorded output hashed to: a recomputed output that hashes the same leaves the
    // later steps' outputs valid.
    const std::string recorded_sha256 = recorded ? record->second.digest.sha256 : "";
    const bool stale_inputs = upstream_changed_;
    const auto options = manifest_.step_options.find(name);
    const bool other_options =
        recorded && options != manifest_.step_options.end() && options->second != step.options;
    if (other_options) {
      std::fprintf(stderr, "datastore build: %s: made with %s, this run asks for %s: rebuilding\n",
                   name.c_str(), options->second.c_str(), step.options.c_str());
    }
    // Hashing an output (keys of hundreds of GB) is skipped where the answer changes nothing:
    // stale inputs remove it anyway, and so do other options of a step that adopts outputs.
    const bool worth_verifying =
        recorded && !stale_inputs && !(other_options && step.adopts_output);
    const bool verifies = worth_verifying && record->second.file == step.output &&
                          VerifyFile(path, record->second.digest).ok();
    if (!stale_inputs && !other_options && verifies) {
      absl::StatusOr<int64_t> bytes =
          step.verify ? step.verify() : absl::StatusOr<int64_t>(record->second.digest.bytes);
      if (bytes.ok()) {
        result.skipped = true;
        result.bytes = *bytes;
        result.detail = "complete and verified";
        std::fprintf(stderr, "datastore build: %s: complete and verified, skipped\n", name.c_str());
        results_.push_back(result);
        return absl::OkStatus();
      }
    }
    // Recomputing. Until the step succeeds the directory keeps what it has: every writer
    // publishes its output whole (temp file, rename; BuildIndex its manifest last), and the
    // records of this step and the later ones stay, so a run that fails (bad options, a full
    // disk) or is stopped loses nothing the next run with the old options could skip. Only what
    // the step might mistake for its own goes first: an output made from stale inputs, one of
    // other options or one that no longer verifies where the step adopts outputs, a recorded
    // output that no longer verifies, and a partial output of stale inputs or other options (a
    // partial one is resumed otherwise).
    std::error_code ignored;
    if (stale_inputs || (recorded && (step.adopts_output || !verifies))) {
      if (step.remove_output) {
        step.remove_output();
      } else {
        fs::remove(path, ignored);
      }
    }
    if (stale_inputs || other_options) fs::remove(PartialPath(path), ignored);
    if (step.adopts_output && recorded) {
      // Unrecorded while it runs (after the removals: unrecorded, an output that did not verify
      // would be adopted): stopped after publishing its output (keys of hundreds of GB are
      // hashed twice after that) but before its record, the next run adopts it after checking
      // it, where a stale record would have had it removed as not verifying.
      manifest_.steps.erase(name);
      manifest_.step_options.erase(name);
      RETURN_IF_ERROR(WriteDatastoreManifest(options_.out_dir, manifest_));
    }
    const absl::Time begin = absl::Now();
    ASSIGN_OR_RETURN(result.detail, step.run());
    result.seconds = absl::ToDoubleSeconds(absl::Now() - begin);
    ASSIGN_OR_RETURN(const FileDigest digest, DigestFile(path));
    if (step.verify) {
      ASSIGN_OR_RETURN(result.bytes, step.verify());
    } else {
      result.bytes = digest.bytes;
    }
    // A new output (or one that was not recorded, so may differ from what the later steps used)
    // makes every later step's output stale: their records go in the same write as this
    // step's, so that no run can find them recorded beside the new output.
    if (digest.sha256 != recorded_sha256) {
      upstream_changed_ = true;
      ForgetStepsNotRunYet();
    }
    manifest_.steps[name] = ManifestFile{step.output, digest};
    manifest_.step_options[name] = step.options;
    RETURN_IF_ERROR(WriteDatastoreManifest(options_.out_dir, manifest_));
    std::fprintf(stderr, "datastore build: %s: %.1f s, %s\n", name.c_str(), result.seconds,
                 result.detail.c_str());
    results_.push_back(result);
    return absl::OkStatus();
  }

  std::vector<StepResult> results() const { return results_; }

 private:
  // Drops the records of every step this build has not run yet: the one that just ran and the
  // later ones.
  void ForgetStepsNotRunYet() {
    std::set<std::string> run;
    for (const StepResult& r : results_) run.insert(r.step);
    for (auto it = manifest_.steps.begin(); it != manifest_.steps.end();) {
      if (run.count(it->first) == 0) {
        manifest_.step_options.erase(it->first);
        it = manifest_.steps.erase(it);
      } else {
        ++it;
      }
    }
  }

  const BuildOptions& options_;
  DatastoreManifest manifest_;
  bool upstream_changed_ = false;
  std::vector<StepResult> results_;
};

// The options of an index step that shape the index (threads and chunking do not).
std::string IndexOptions(const IndexBuildOptions& o) {
  return absl::StrCat("factory=", o.factory, " metric=", MetricName(o.metric), " shards=", o.shards,
                      " train_size=", o.train_size, " opq_iterations=", o.opq_iterations,
                      " seed=", o.seed, " subset_m=", o.subset_m);
}

std::string KeysDetail(const KeysReport& r) {
  if (r.already_complete) {
    return absl::StrFormat("%d x %d keys, already complete (checked and kept)", r.rows, r.dim);
  }
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

// The options of the index step, or of the sentence index step.
IndexBuildOptions IndexStepOptions(const BuildOptions& options, bool sentences) {
  IndexBuildOptions index = options.index;
  index.threads = options.threads;
  if (sentences) {
    index.factory = options.sentence_factory;
    index.shards = 1;
  }
  return index;
}

// A factory string faiss cannot build would fail an index step only after the keys, hours on
// a large corpus: for each index step that will run, the factory is tried first for keys of
// the model's width (d_model: the width of both key features and of the sentence embeddings).
absl::Status CheckFactoriesBeforeKeys(const BuildOptions& options,
                                      const DatastoreManifest& manifest) {
  std::optional<int> dim;
  for (const bool sentences : {false, true}) {
    const IndexBuildOptions index = IndexStepOptions(options, sentences);
    const std::string step = sentences ? "sentence_index" : "index";
    const auto recorded = manifest.step_options.find(step);
    if (manifest.steps.count(step) > 0 && recorded != manifest.step_options.end() &&
        recorded->second == IndexOptions(index)) {
      continue;  // built with these options: checked then
    }
    if (!dim.has_value()) {
      ASSIGN_OR_RETURN(const model::LoadedModel loaded, model::LoadCheckpoint(options.model_path));
      dim = static_cast<int>(loaded.model->config().d_model);
    }
    if (const absl::Status status = CheckIndexFactory(index, *dim); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          sentences ? "--sentence-factory " : "--factory ", index.factory, ": ", status.message()));
    }
  }
  return absl::OkStatus();
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
  RETURN_IF_ERROR(CheckFactoriesBeforeKeys(options, manifest));
  manifest.inputs = inputs;
  Pipeline pipeline(options, std::move(manifest));

  const std::string values_path = Join(options.out_dir, kValuesFileName);
  StepSpec values_step;
  values_step.name = "values";
  values_step.output = kValuesFileName;
  values_step.options = absl::StrCat("max_tokens=", options.max_sentence_tokens,
                                     " strict=", options.strict ? "true" : "false");
  values_step.run = [&]() -> absl::StatusOr<std::string> {
    ValuesBuildOptions values;
    values.corpus_path = options.corpus_path;
    values.out_path = values_path;
    values.max_tokens = options.max_sentence_tokens;
    values.strict = options.strict;
    values.threads = options.threads;
    ASSIGN_OR_RETURN(const ValuesReport r, RunValuesStep(*tokenizer, values));
    return absl::StrCat(r.sentences, " sentences, ", r.target_tokens, " target tokens, ",
                        r.bad.Summary());
  };
  RETURN_IF_ERROR(pipeline.Step(values_step));

  for (const KeyKind kind : {KeyKind::kTokens, KeyKind::kSentences}) {
    const bool tokens = kind == KeyKind::kTokens;
    const std::string file = tokens ? kKeysFileName : kSentenceKeysFileName;
    StepSpec step;
    step.name = tokens ? "keys" : "sentence_keys";
    step.output = file;
    step.options = absl::StrCat("fp16=", options.keys.fp16 ? "true" : "false");
    step.run = [&]() -> absl::StatusOr<std::string> {
      KeysStepOptions keys;
      keys.values_path = values_path;
      keys.model_path = options.model_path;
      keys.out_path = Join(options.out_dir, file);
      keys.feature = options.feature;
      keys.device = options.device;
      keys.threads = options.threads;
      keys.keys = options.keys;
      keys.keys.kind = kind;
      ASSIGN_OR_RETURN(const KeysReport r, RunKeysStep(keys));
      return KeysDetail(r);
    };
    step.adopts_output = true;
    RETURN_IF_ERROR(pipeline.Step(step));
  }

  for (const bool sentences : {false, true}) {
    const std::string dir_name = sentences ? kSentenceIndexDirName : kIndexDirName;
    const std::string dir = Join(options.out_dir, dir_name);
    const IndexBuildOptions index = IndexStepOptions(options, sentences);
    StepSpec step;
    step.name = sentences ? "sentence_index" : "index";
    step.output = Join(dir_name, kManifestFileName);
    step.options = IndexOptions(index);
    step.run = [&]() -> absl::StatusOr<std::string> {
      return RunIndex(Join(options.out_dir, sentences ? kSentenceKeysFileName : kKeysFileName),
                      sentences ? std::string() : values_path, index, dir);
    };
    step.verify = [&] { return VerifyIndexDirectory(dir); };
    // Whole: left to BuildIndex, a stale index whose manifest alone went would stay beside the
    // new one while it is built, and the files the new one does not reuse would stay for good.
    step.remove_output = [&] { RemoveIndex(dir); };
    RETURN_IF_ERROR(pipeline.Step(step));
  }
  return pipeline.results();
}

absl::Status CheckValuesMayBeWritten(const std::string& dir) {
  for (const std::string& name :
       {std::string(kDatastoreManifestFileName), std::string(kKeysFileName),
        PartialPath(kKeysFileName), std::string(kSentenceKeysFileName),
        PartialPath(kSentenceKeysFileName), std::string(kIndexDirName),
        std::string(kSentenceIndexDirName)}) {
    const std::string path = Join(dir, name);
    std::error_code ignored;
    if (fs::exists(path, ignored)) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, " already holds ", path,
          ", computed from its values.h5: writing another values.h5 "
          "would leave it describing other sentences (use a new directory, or `datastore build`)"));
    }
  }
  return absl::OkStatus();
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
