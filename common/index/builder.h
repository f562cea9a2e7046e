// Sharded index build: train once on a sample, split the vectors into S shards by contiguous
// global id ranges (at sentence boundaries when values are given, so each shard's tokens are
// exactly the tokens of its sentences), every shard a copy of the one trained index, and write
// the index directory: one faiss file per shard, its values and subset codes, the subset
// quantizer, and the manifest last. All files are written atomically. An index grows by new
// shards of the rows appended to its datastore (AddToIndex).
#ifndef KNNSERVE_COMMON_INDEX_BUILDER_H_
#define KNNSERVE_COMMON_INDEX_BUILDER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/datastore/key_source.h"
#include "common/index/manifest.h"
#include "common/progress.h"
#include "common/search_types.h"

namespace knnserve {

struct IndexBuildOptions {
  std::string factory = "Flat";  // faiss index_factory string
  Metric metric = Metric::kL2;
  int shards = 1;
  int64_t train_size = 1'000'000;  // rows sampled (uniformly, seeded) to train; all if fewer
  int threads = 1;                 // OpenMP threads for training, adding and encoding
  int64_t chunk_rows = 65536;      // keys read and added per step
  int opq_iterations = 0;          // OPQ training iterations; 0 keeps faiss's default (50)
  uint64_t seed = 1;
  // Subset codes (built when values are given): sub-quantizers of the subset PQ; 0 takes the
  // index's own PQ M, and builds no subset codes for an index without PQ.
  int subset_m = 0;
  ProgressBar::Options progress;
};

// Whether faiss can make an index of `options.factory` and `options.metric` for keys of width
// `dim` (INVALID_ARGUMENT naming the factory otherwise), without reading any key: a caller that
// computes the keys first checks this before.
absl::Status CheckIndexFactory(const IndexBuildOptions& options, int dim);

// Removes the index in `dir`: its manifest and the files it lists (other files stay).
void RemoveIndex(const std::string& dir);

// Builds the index of `keys` into `out_dir` (created if missing; removed again when the build
// fails and it is left empty). The build holds `out_dir`'s DirectoryLock (FAILED_PRECONDITION
// while another command holds it) and first removes what killed builds staged there.
// `values` may be null; when set it must have valid offsets and keys.rows() tokens
// (INVALID_ARGUMENT otherwise), and each shard then carries its values and, see subset_m, the
// subset PQ codes of its sentences.
//
// Memory: the training sample, one chunk of keys (and of tokens), and the shard being built (its
// faiss index, streamed to its file when whole); its subset codes go to their file chunk by
// chunk as they are encoded. Of the values only what `values` itself holds (offsets, for the
// streaming sources), since each shard's values file is read from `values` and written
// chunk_rows tokens at a time.
absl::StatusOr<IndexManifest> BuildIndex(const KeySource& keys, const ValueSource* values,
                                         const IndexBuildOptions& options,
                                         const std::string& out_dir);

struct IndexAddOptions {
  int shards = 1;              // new shards the added rows are split into
  int threads = 1;             // OpenMP threads for adding and encoding
  int64_t chunk_rows = 65536;  // keys read and added per step
  ProgressBar::Options progress;
};

// Grows the index in `dir` by the rows of `keys` it does not hold yet, [total_vectors,
// keys.rows()) of its manifest: they become `options.shards` new shards after the last one
// (contiguous id ranges; at sentence boundaries with values), each a copy of the trained state
// the index's shards share (FaissIndex::ReadTrainedEmpty of its smallest shard file) holding its
// rows, their values and, if the index has them, their subset codes (encoded by the index's
// subset quantizer). Nothing is trained, so the old and new shards' answers merge as one index's
// would. The shards already there are neither rewritten nor renumbered.
//
// `keys` and `values` are the index's datastore grown by appending: `values` is required
// exactly when the index carries values (INVALID_ARGUMENT otherwise); its first num_sentences
// sentences must end where the index ends and hold, shard by shard, the tokens of each shard's
// values file (compared by SHA-256), else FAILED_PRECONDITION naming the shard. The keys of the
// rows already indexed are not read again. NOT_FOUND when `dir` holds no index.
//
// The new files get numbers no shard has and the manifest is replaced last, atomically: until
// then the index is the one it was, and a failed add leaves it so (its staged files removed).
// Holds `dir`'s DirectoryLock. Memory: the smallest shard's index while it is read, then as
// BuildIndex for the new shards.
absl::StatusOr<IndexManifest> AddToIndex(const KeySource& keys, const ValueSource* values,
                                         const IndexAddOptions& options, const std::string& dir);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_INDEX_BUILDER_H_
