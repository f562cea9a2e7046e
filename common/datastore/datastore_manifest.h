// The datastore directory's manifest (datastore.json): what each completed step of
// `knnserve datastore build` produced, with the file's size and SHA-256, and the fingerprints of
// the inputs the whole directory was built from. Rewritten atomically after every step, so a
// step listed here is complete; a rerun skips a step whose entry exists and whose file still
// verifies, and refuses a directory built from another corpus, tokenizer or model.
//
//   {"format": "knnserve-datastore", "version": 1,
//    "inputs": {"corpus_sha256": ..., "tokenizer_sha256": ..., "model_sha256": ...},
//    "steps": {"values": {"file": "values.h5", "bytes": ..., "sha256": ...},
//              "keys": {...}, "sentence_keys": {...},
//              "index": {"file": "index/manifest.json", ...}, "sentence_index": {...}}}
#ifndef KNNSERVE_COMMON_DATASTORE_DATASTORE_MANIFEST_H_
#define KNNSERVE_COMMON_DATASTORE_DATASTORE_MANIFEST_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/index/manifest.h"

namespace knnserve {

inline constexpr char kDatastoreManifestFileName[] = "datastore.json";

struct DatastoreManifest {
  static constexpr int kVersion = 1;

  std::map<std::string, std::string> inputs;  // fingerprint name -> value
  std::map<std::string, ManifestFile> steps;  // step name -> its output (relative path)
  // step name -> the options its output was made with (absent in datastores built before they
  // were recorded)
  std::map<std::string, std::string> step_options;

  std::string ToJson() const;
  static absl::StatusOr<DatastoreManifest> FromJson(const std::string& json,
                                                    const std::string& source);
};

// nullopt when `dir` has no datastore.json.
absl::StatusOr<std::optional<DatastoreManifest>> ReadDatastoreManifest(const std::string& dir);
absl::Status WriteDatastoreManifest(const std::string& dir, const DatastoreManifest& manifest);

// FAILED_PRECONDITION naming the first input of `expected` that `manifest` records with another
// value (a directory built from another corpus, tokenizer or model).
absl::Status CheckInputs(const DatastoreManifest& manifest,
                         const std::map<std::string, std::string>& expected,
                         const std::string& dir);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_DATASTORE_MANIFEST_H_
