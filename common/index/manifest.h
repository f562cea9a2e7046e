// The index directory's manifest (manifest.json): what was built and every file's size and
// SHA-256. Written last and atomically, so a directory with a manifest is a complete build.
//
//   {"format": "knnserve-index", "version": 1, "factory": "OPQ64_256,IVF4096,PQ64",
//    "metric": "L2", "dim": 512, "total_vectors": N, "num_sentences": S,
//    "subset": {"m": 64, "quantizer": {"file": ..., "bytes": ..., "sha256": ...}},   (optional)
//    "shards": [{"id_begin": 0, "id_end": n0, "sentence_begin": 0, "sentence_end": s0,
//                "index": {file...}, "values": {file...}, "subset_codes": {file...}}, ...]}
#ifndef KNNSERVE_COMMON_INDEX_MANIFEST_H_
#define KNNSERVE_COMMON_INDEX_MANIFEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/files.h"
#include "common/search_types.h"

namespace knnserve {

inline constexpr char kManifestFileName[] = "manifest.json";

// A file of the index directory: name relative to the directory, and its digest.
struct ManifestFile {
  std::string file;
  FileDigest digest;
};

struct ShardManifest {
  int64_t id_begin = 0;  // global token ids [id_begin, id_end)
  int64_t id_end = 0;
  int64_t sentence_begin = 0;  // sentences [sentence_begin, sentence_end); both 0 without values
  int64_t sentence_end = 0;
  ManifestFile index;                        // faiss write_index format, local ids 0..n-1
  std::optional<ManifestFile> values;        // int32 value per token (shard_data.h)
  std::optional<ManifestFile> subset_codes;  // PQ codes of the sentences (shard_data.h)
};

struct IndexManifest {
  static constexpr int kVersion = 1;

  std::string factory;
  Metric metric = Metric::kL2;
  int dim = 0;
  int64_t total_vectors = 0;
  int64_t num_sentences = 0;  // 0 without values
  int subset_m = 0;           // 0 without subset codes
  std::optional<ManifestFile> subset_quantizer;
  std::vector<ShardManifest> shards;

  // Every file the manifest lists: the subset quantizer, then per shard its index, values and
  // subset codes.
  std::vector<ManifestFile> Files() const;
  std::string ToJson() const;
  // Parses and checks consistency (contiguous shard ranges covering [0, total_vectors)).
  static absl::StatusOr<IndexManifest> FromJson(const std::string& json, const std::string& source);
};

absl::StatusOr<IndexManifest> ReadManifest(const std::string& dir);
// The manifest's file `f` of `dir`, checked against its size and digest before it is read.
absl::StatusOr<std::unique_ptr<VerifiedFileReader>> OpenChecked(const std::string& dir,
                                                                const ManifestFile& f);
absl::StatusOr<FileDigest> WriteManifest(const std::string& dir, const IndexManifest& manifest);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_INDEX_MANIFEST_H_
