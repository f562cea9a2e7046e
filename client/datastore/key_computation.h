// The keys step: values.h5 + a model -> keys.h5 (one key per target token) or
// sentence_keys.h5 (one embedding per sentence), both /keys [rows, d] (keys_file.h).
//
// Sentences are processed in their stored order (sorted by length) in token-budgeted batches
// (batch_plan.h), so batches pad little. The output is checkpointed at batch boundaries every
// `checkpoint_rows` rows; a rerun after a kill resumes at the last checkpoint, and since batches
// are a pure function of the lengths and the batch limits (recorded in the file's identity), a
// resumed run writes exactly the bytes an uninterrupted one would (same build, same --threads).
#ifndef KNNSERVE_CLIENT_DATASTORE_KEY_COMPUTATION_H_
#define KNNSERVE_CLIENT_DATASTORE_KEY_COMPUTATION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "client/datastore/feature_extractor.h"
#include "common/datastore/values_file.h"
#include "common/files.h"
#include "common/progress.h"

namespace knnserve::datastore {

enum class KeyKind { kTokens, kSentences };

struct KeysOptions {
  KeyKind kind = KeyKind::kTokens;
  bool fp16 = true;
  int64_t max_tokens = 4096;    // per batch: sentences x longest (source or target) length
  int64_t max_sentences = 256;  // per batch
  int64_t checkpoint_rows = 1 << 16;
  // Tokens per side read from values.h5 at a time: consecutive whole batches (at least one).
  // Bounds the tokens in memory; does not change the output.
  int64_t read_window_tokens = 1 << 20;
  ProgressBar::Options progress;
  // Test hook: called after every checkpoint with the number of checkpoints so far.
  std::function<void(int64_t)> after_checkpoint;
};

struct KeysReport {
  int64_t rows = 0;
  int dim = 0;
  int64_t batches = 0;
  int64_t resumed_from = 0;     // rows already done by an earlier run
  double padding_fraction = 0;  // of the batch plan, both sides
  double seconds = 0;           // of this run's computation
  double rows_per_second = 0;   // rows computed by this run / seconds
  bool already_complete = false;
  FileDigest digest;
};

// The sentences `ids` of the two sides as a batch (spans into `source` and `target`).
// REQUIRES: both sides have the same sentences, ids in [0, source.num_sentences()).
SentenceBatch BatchOf(const DatastoreValues& source, const DatastoreValues& target,
                      absl::Span<const int64_t> ids);

// Computes the keys of `values` into `out_path` with `extractor`, resuming "<out>.partial"
// when its identity (`identity` plus the batch limits) matches. REQUIRES: out_path's final file
// does not exist yet (see RunKeysStep).
//
// Streams the tokens: they are read from `values` in windows of consecutive batches (one read per
// side per window, options.read_window_tokens), so memory holds the reader's per-sentence arrays,
// O(sentences) batch-plan vectors, one window of tokens and the extractor's tensors, never all
// tokens. A token id outside the vocabulary fails the run at its window (after the checkpoints
// before it).
absl::StatusOr<KeysReport> ComputeKeys(const ValuesReader& values, FeatureExtractor& extractor,
                                       const KeysOptions& options,
                                       std::map<std::string, std::string> identity,
                                       const std::string& out_path);

struct KeysStepOptions {
  std::string values_path;
  std::string model_path;  // a checkpoint (client/model/checkpoint.h)
  std::string out_path;
  std::string feature = kFeatureDecoderOut;  // token keys only
  std::string device = "cpu";
  int threads = 2;  // LibTorch intra-op threads
  KeysOptions keys;
};

// The whole step as the CLI runs it: loads the values and the model, refuses a model whose
// tokenizer (or vocabulary) differs from the one the values were made with, skips the work when
// `out_path` is already complete for the same model, values and feature (refusing one made
// from others), and otherwise computes (or resumes) it.
absl::StatusOr<KeysReport> RunKeysStep(const KeysStepOptions& options);

}  // namespace knnserve::datastore

#endif  // KNNSERVE_CLIENT_DATASTORE_KEY_COMPUTATION_H_
