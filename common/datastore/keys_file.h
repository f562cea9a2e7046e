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
  // How the rows are computed (e.g. the batch plan): stored too; a partial made with another
  // layout is started over on resume, not refused.
  std::map<std::string, std::string> layout;
};

class Hdf5File;

class KeysFileWriter {
 public:
  // Resumes "<path>.partial" when it exists with the same shape, dtype and identity; FAILED_
  // PRECONDITION naming the difference when it exists with another identity (another model,
  // tokenizer or datastore); starts it over when only its shape, dtype or layout differ; creates it
  // otherwise. A partial that cannot be opened is kept and the error names it (HDF5 refuses
  // to open a file another process holds): it is never created under its own name, so it is
  // never a half-created file.
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

// Whether the complete keys file at `path` is what `spec` would compute: FAILED_PRECONDITION
// naming the first identity attribute that differs (another computation), DATA_LOSS when the
// file is not marked complete, false when only its shape or dtype differ, true when it matches.
absl::StatusOr<bool> CompleteKeysFileMatches(const std::string& path, const KeysFileSpec& spec);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_KEYS_FILE_H_
