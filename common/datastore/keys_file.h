// A resumable key matrix (keys.h5, sentence_keys.h5): /keys float16 or float32 [rows, dim],
// written in row order to "<path>.partial" and renamed to `path` when every row is there.
//
// Root attributes: format "knnserve-keys", dim, dtype ("float16" | "float32"), rows_completed,
// complete (0 | 1), and the identity of the computation (model_sha256, values_sha256, feature,
// ...: any string attributes the caller names). Checkpoint() makes the rows written so far
// durable (HDF5 flush, fsync) before it advances rows_completed, so a process killed at any
// point leaves a partial file whose rows [0, rows_completed) are valid; CreateOrResume() then
// continues from there. Resuming against a different identity is refused, naming the attribute.
//
// Thread-compatible.
#ifndef KNNSERVE_COMMON_DATASTORE_KEYS_FILE_H_
#define KNNSERVE_COMMON_DATASTORE_KEYS_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/files.h"
#include "common/matrix.h"

namespace knnserve {

inline constexpr char kKeysFormat[] = "knnserve-keys";

struct KeysFileSpec {
  int64_t rows = 0;
  int dim = 0;
  bool fp16 = true;
  int64_t chunk_rows = 0;  // HDF5 chunk; 0 picks about 1 MiB per chunk
  // Identity of the computation: stored as string attributes and compared on resume.
  std::map<std::string, std::string> identity;
};

class Hdf5File;

class KeysFileWriter {
 public:
  // Resumes "<path>.partial" when it exists with the same shape, dtype and identity; FAILED_
  // PRECONDITION naming the difference when it exists with another; creates it otherwise.
  static absl::StatusOr<std::unique_ptr<KeysFileWriter>> CreateOrResume(const std::string& path,
                                                                        const KeysFileSpec& spec);
  ~KeysFileWriter();

  int64_t rows_completed() const { return rows_written_; }
  // Rows recorded as durable when the writer was opened (0 for a new file).
  int64_t resumed_from() const { return resumed_from_; }

  // Writes the next rows (rows_completed() onwards). REQUIRES: rows.cols == dim and they fit.
  absl::Status Append(MatrixView<const float> rows);
  // Makes the appended rows durable and records them in rows_completed.
  absl::Status Checkpoint();
  // REQUIRES: every row appended. Checkpoints, marks the file complete, closes it and renames
  // it to `path`; returns the digest of the final file.
  absl::StatusOr<FileDigest> Commit();

 private:
  KeysFileWriter(std::string path, KeysFileSpec spec, std::unique_ptr<Hdf5File> file,
                 int64_t rows_completed);

  const std::string path_;
  const KeysFileSpec spec_;
  std::unique_ptr<Hdf5File> file_;
  const int64_t resumed_from_;
  int64_t rows_written_;
};

// The identity attributes of a complete keys file, and FAILED_PRECONDITION naming the first that
// differs from `identity` (or DATA_LOSS when the file is not marked complete).
absl::Status CheckKeysFile(const std::string& path,
                           const std::map<std::string, std::string>& identity);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_KEYS_FILE_H_
