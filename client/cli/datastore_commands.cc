// `knnserve datastore values|keys|sentence-keys|build`: corpus + model -> datastore directory
// (client/datastore/pipeline.h describes the layout).
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/cli/commands.h"
#include "client/datastore/key_computation.h"
#include "client/datastore/pipeline.h"
#include "common/cli_checks.h"
#include "common/datastore/hdf5_datastore.h"
#include "common/datastore/values_builder.h"
#include "common/datastore/values_file.h"
#include "common/files.h"
#include "common/index/builder.h"
#include "common/progress.h"

namespace knnserve::cli {
namespace {

namespace ds = knnserve::datastore;

std::string InDir(const std::string& dir, const char* name) { return dir + "/" + name; }

struct KeysFlags {
  std::string model;
  std::string dir;
  std::string feature = ds::kFeatureDecoderOut;
  std::string device = "cpu";
  bool fp32 = false;
  int threads = 2;
  int64_t batch_tokens = 4096;
  int64_t batch_sentences = 256;
  int64_t checkpoint_rows = 1 << 16;
  int64_t kill_after_checkpoints = 0;  // testing: SIGKILL itself after N checkpoints
};

void AddKeysFlags(CLI::App* cmd, KeysFlags& f) {
  cmd->add_option("--model", f.model, "model checkpoint (.pt)")->required();
  cmd->add_option("--device", f.device, "cpu | cuda[:N] (CUDA LibTorch builds)")
      ->capture_default_str();
  cmd->add_option("--threads", f.threads, "LibTorch threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--batch-tokens", f.batch_tokens, "padded tokens per batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--batch-sentences", f.batch_sentences, "sentences per batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--checkpoint-rows", f.checkpoint_rows, "rows between resumable checkpoints")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--debug-kill-after-checkpoints", f.kill_after_checkpoints,
                  "testing: kill the process (SIGKILL) after N checkpoints")
      ->group("");
}

ds::KeysStepOptions KeysStep(const KeysFlags& f, ds::KeyKind kind) {
  ds::KeysStepOptions step;
  step.values_path = InDir(f.dir, kValuesFileName);
  step.model_path = f.model;
  step.out_path =
      InDir(f.dir, kind == ds::KeyKind::kTokens ? kKeysFileName : kSentenceKeysFileName);
  step.feature = f.feature;
  step.device = f.device;
  step.threads = f.threads;
  step.keys.kind = kind;
  step.keys.fp16 = !f.fp32;
  step.keys.max_tokens = f.batch_tokens;
  step.keys.max_sentences = f.batch_sentences;
  step.keys.checkpoint_rows = f.checkpoint_rows;
  if (f.kill_after_checkpoints > 0) {
    const int64_t n = f.kill_after_checkpoints;
    step.keys.after_checkpoint = [n](int64_t done) {
      if (done >= n) std::raise(SIGKILL);
    };
  }
  return step;
}

void PrintKeysReport(const ds::KeysReport& r, const std::string& path) {
  if (r.already_complete) {
    std::fprintf(stderr, "%s is already complete for this model and datastore\n", path.c_str());
    return;
  }
  std::fprintf(
      stderr, "wrote %s: %lld x %d, %lld batches, padding %.1f%%, %.1f s, %.0f rows/s%s\n",
      path.c_str(), static_cast<long long>(r.rows), r.dim, static_cast<long long>(r.batches),
      100 * r.padding_fraction, r.seconds, r.rows_per_second,
      r.resumed_from > 0 ? absl::StrFormat(" (resumed from row %d)", r.resumed_from).c_str() : "");
}

// The datastore directory (created when missing), locked against other commands for the
// command's life, with what killed writers left in it removed.
std::unique_ptr<DirectoryLock> LockDatastore(const std::string& dir) {
  std::unique_ptr<DirectoryLock> lock = ValueOrExit(DirectoryLock::Acquire(dir));
  if (const int removed =
          lock->RemoveDebris(DirectoryLock::DebrisScope::kDirectoryAndSubdirectories);
      removed > 0) {
    std::fprintf(stderr, "%s: removed %d temporary files that killed runs left\n", dir.c_str(),
                 removed);
  }
  return lock;
}

void RegisterValues(CLI::App& parent) {
  struct Flags {
    std::string corpus, tokenizer, model, dir;
    ValuesBuildOptions options;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = parent.add_subcommand("values", "tokenize a TSV corpus into DIR/values.h5");
  cmd->add_option("--corpus", f->corpus, "source<TAB>target lines")->required();
  cmd->add_option("--tokenizer", f->tokenizer, "SentencePiece .model");
  cmd->add_option("--model", f->model, "take the tokenizer embedded in this checkpoint");
  cmd->add_option("--out", f->dir, "datastore directory")->required();
  cmd->add_option("--max-tokens", f->options.max_tokens,
                  "longest side kept, tokens with EOS (longer lines are bad lines)")
      ->check(CLI::Range(2, 1 << 24))  // a token and its EOS
      ->capture_default_str();
  cmd->add_flag("--strict", f->options.strict, "a bad corpus line is an error");
  cmd->add_option("--threads", f->options.threads, "tokenizer threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->callback([f] {
    if (f->tokenizer.empty() == f->model.empty()) {
      ExitOnError(absl::InvalidArgumentError("give exactly one of --tokenizer and --model"));
    }
    const std::unique_ptr<DirectoryLock> lock = LockDatastore(f->dir);
    ExitOnError(ds::CheckValuesMayBeWritten(f->dir));
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        ds::LoadTokenizer(f->tokenizer, f->model);
    ExitOnError(tokenizer.status());
    f->options.corpus_path = f->corpus;
    f->options.out_path = InDir(f->dir, kValuesFileName);
    absl::StatusOr<ValuesReport> r = ds::RunValuesStep(**tokenizer, f->options);
    ExitOnError(r.status());
    std::fprintf(stderr,
                 "wrote %s: %lld sentences of %lld lines, %lld target and %lld source tokens, "
                 "%lld bytes; %s\n",
                 f->options.out_path.c_str(), static_cast<long long>(r->sentences),
                 static_cast<long long>(r->corpus_lines), static_cast<long long>(r->target_tokens),
                 static_cast<long long>(r->source_tokens), static_cast<long long>(r->digest.bytes),
                 r->bad.Summary().c_str());
  });
}

void RegisterKeys(CLI::App& parent) {
  auto f = std::make_shared<KeysFlags>();
  CLI::App* cmd = parent.add_subcommand(
      "keys", "teacher-forced decoder features of DIR/values.h5 -> DIR/keys.h5 (resumable)");
  cmd->add_option("--out", f->dir, "datastore directory (holds values.h5)")->required();
  cmd->add_option("--feature", f->feature, "decoder_out | ffn_in")->capture_default_str();
  cmd->add_flag("--fp32", f->fp32, "store float32 keys (default float16)");
  AddKeysFlags(cmd, *f);
  cmd->callback([f] {
    const std::unique_ptr<DirectoryLock> lock = LockDatastore(f->dir);
    const ds::KeysStepOptions step = KeysStep(*f, ds::KeyKind::kTokens);
    absl::StatusOr<ds::KeysReport> r = ds::RunKeysStep(step);
    ExitOnError(r.status());
    PrintKeysReport(*r, step.out_path);
  });
}

void RegisterSentenceKeys(CLI::App& parent) {
  auto f = std::make_shared<KeysFlags>();
  auto factory = std::make_shared<std::string>("Flat");
  CLI::App* cmd = parent.add_subcommand(
      "sentence-keys",
      "mean encoder output per sentence -> DIR/sentence_keys.h5 and DIR/sentence_index/");
  cmd->add_option("--out", f->dir, "datastore directory (holds values.h5)")->required();
  cmd->add_option("--factory", *factory, "faiss factory string of the sentence index")
      ->capture_default_str();
  AddKeysFlags(cmd, *f);
  cmd->callback([f, factory] {
    const std::unique_ptr<DirectoryLock> lock = LockDatastore(f->dir);
    const ds::KeysStepOptions step = KeysStep(*f, ds::KeyKind::kSentences);
    absl::StatusOr<ds::KeysReport> r = ds::RunKeysStep(step);
    ExitOnError(r.status());
    PrintKeysReport(*r, step.out_path);
    absl::StatusOr<std::unique_ptr<Hdf5KeySource>> keys = Hdf5KeySource::Open(step.out_path);
    ExitOnError(keys.status());
    IndexBuildOptions index;
    index.factory = *factory;
    index.threads = f->threads;
    const std::string dir = InDir(f->dir, ds::kSentenceIndexDirName);
    absl::StatusOr<IndexManifest> manifest = BuildIndex(**keys, nullptr, index, dir);
    ExitOnError(manifest.status());
    std::fprintf(stderr, "wrote %s: %s over %lld sentences\n", dir.c_str(), factory->c_str(),
                 static_cast<long long>(manifest->total_vectors));
  });
}

void RegisterBuild(CLI::App& parent) {
  auto f = std::make_shared<KeysFlags>();
  auto o = std::make_shared<ds::BuildOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "build", "all steps: values, keys, sentence keys, index (+ subset codes), sentence index");
  cmd->add_option("--corpus", o->corpus_path, "source<TAB>target lines")->required();
  cmd->add_option("--tokenizer", o->tokenizer_path, "SentencePiece .model (default: the model's)");
  cmd->add_option("--out", f->dir, "datastore directory")->required();
  cmd->add_option("--factory", o->index.factory, "faiss factory string of the token index")
      ->capture_default_str();
  cmd->add_option("--shards", o->index.shards)
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--subset-m", o->index.subset_m, "subset PQ sub-quantizers (0: the index's)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  cmd->add_option("--train-size", o->index.train_size)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--sentence-factory", o->sentence_factory)->capture_default_str();
  cmd->add_option("--max-tokens", o->max_sentence_tokens, "longest side kept (tokens with EOS)")
      ->check(CLI::Range(2, 1 << 24))  // a token and its EOS
      ->capture_default_str();
  cmd->add_flag("--strict", o->strict, "a bad corpus line is an error");
  cmd->add_option("--feature", f->feature, "decoder_out | ffn_in")->capture_default_str();
  cmd->add_flag("--fp32", f->fp32, "store float32 keys (default float16)");
  AddKeysFlags(cmd, *f);
  cmd->callback([f, o] {
    const std::unique_ptr<DirectoryLock> lock = LockDatastore(f->dir);
    const ds::KeysStepOptions step = KeysStep(*f, ds::KeyKind::kTokens);
    o->model_path = f->model;
    o->out_dir = f->dir;
    o->threads = f->threads;
    o->feature = f->feature;
    o->device = f->device;
    o->keys = step.keys;
    absl::StatusOr<std::vector<ds::StepResult>> results = ds::BuildDatastore(*o);
    ExitOnError(results.status());
    std::printf("%-16s %10s %14s  %s\n", "step", "seconds", "bytes", "detail");
    for (const ds::StepResult& r : *results) {
      std::printf("%-16s %10s %14lld  %s\n", r.step.c_str(),
                  r.skipped ? "skipped" : absl::StrFormat("%.1f", r.seconds).c_str(),
                  static_cast<long long>(r.bytes), r.detail.c_str());
    }
  });
}

}  // namespace

void RegisterDatastoreCommands(CLI::App& app) {
  CLI::App* datastore = app.add_subcommand("datastore", "build kNN-MT datastores");
  datastore->require_subcommand(1);
  RegisterValues(*datastore);
  RegisterKeys(*datastore);
  RegisterSentenceKeys(*datastore);
  RegisterBuild(*datastore);
}

}  // namespace knnserve::cli
