// `knnserve datastore build`: corpus + model -> a complete datastore directory in one command:
//
//   DIR/values.h5          values step (values_builder.h)
//   DIR/keys.h5            token keys (key_computation.h), resumable
//   DIR/sentence_keys.h5   sentence embeddings (mean of the encoder output), resumable
//   DIR/index/             the token index (common/index/builder.h) with values and the subset
//                          PQ codes grouped by sentence, in S shards
//   DIR/sentence_index/    the sentence index (faiss factory, Flat by default), one shard
//   DIR/datastore.json     inputs' fingerprints and each completed step's output digest
//
// Steps whose output is listed in datastore.json and still verifies (size and SHA-256, and for
// an index every file its manifest lists) are skipped; a step recomputed makes every later step
// recompute too. A directory built from another corpus, tokenizer or model is refused.
#ifndef KNNSERVE_CLIENT_DATASTORE_PIPELINE_H_
#define KNNSERVE_CLIENT_DATASTORE_PIPELINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/datastore/key_computation.h"
#include "client/tokenizer/tokenizer.h"
#include "common/datastore/values_builder.h"
#include "common/index/builder.h"

namespace knnserve::datastore {

inline constexpr char kIndexDirName[] = "index";
inline constexpr char kSentenceIndexDirName[] = "sentence_index";

struct BuildOptions {
  std::string corpus_path;
  std::string model_path;
  std::string tokenizer_path;  // "" uses the tokenizer embedded in the model checkpoint
  std::string out_dir;
  int threads = 2;
  // values
  int64_t max_sentence_tokens = 1024;
  bool strict = false;
  // keys
  std::string feature = kFeatureDecoderOut;
  std::string device = "cpu";
  KeysOptions keys;  // kind is set per step
  // indexes
  IndexBuildOptions index;  // factory, shards, subset_m, train_size
  std::string sentence_factory = "Flat";
};

struct StepResult {
  std::string step;
  bool skipped = false;
  double seconds = 0;
  int64_t bytes = 0;   // of the step's output file (the index: all its files)
  std::string detail;  // one line: counts, rates
};

// The tokenizer in `tokenizer_path` (a SentencePiece .model), or when that is "" the one
// embedded in the checkpoint `model_path`.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& tokenizer_path,
                                                         const std::string& model_path);

// The values step with `tokenizer` (options.tokenizer is filled from it).
absl::StatusOr<ValuesReport> RunValuesStep(const Tokenizer& tokenizer, ValuesBuildOptions options);

absl::StatusOr<std::vector<StepResult>> BuildDatastore(const BuildOptions& options);

// OK when a values step alone (`knnserve datastore values`) may write `dir`/values.h5: the
// directory holds nothing computed from a values.h5 (keys, sentence keys, an index, or the
// datastore.json of BuildDatastore). FAILED_PRECONDITION naming what it holds otherwise: a new
// values.h5 would leave those describing other sentences.
absl::Status CheckValuesMayBeWritten(const std::string& dir);

// Whether kNN-MT decoding with the checkpoint `model_path` may use the datastore in `dir`: the
// decoder queries with its output features (kFeatureDecoderOut), so the keys must come from that
// model (same SHA-256) and that feature. FAILED_PRECONDITION naming the mismatch otherwise. A
// directory without datastore.json (an index assembled by hand) passes unchecked.
absl::Status CheckDatastoreForDecoding(const std::string& dir, const std::string& model_path);

}  // namespace knnserve::datastore

#endif  // KNNSERVE_CLIENT_DATASTORE_PIPELINE_H_
