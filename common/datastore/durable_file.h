// File-level durability for outputs written by libraries that own their file handles (HDF5):
// the writer works on a temporary name, then PublishFile() fsyncs it, renames it over the final
// name and fsyncs the directory. A crash leaves the temporary file, never a final name holding a
// half-written file. Also streaming digests of files too large to read whole (keys.h5).
// (common/files.h does the same for byte streams it writes itself.)
#ifndef KNNSERVE_COMMON_DATASTORE_DURABLE_FILE_H_
#define KNNSERVE_COMMON_DATASTORE_DURABLE_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/files.h"

namespace knnserve {

// "<path>.partial": where an output is built before PublishFile().
std::string PartialPath(const std::string& path);

// fsync(temp_path), rename(temp_path, final_path), fsync(directory of final_path).
absl::Status PublishFile(const std::string& temp_path, const std::string& final_path);

// Size and SHA-256 of a file, read in 4 MiB blocks.
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

// DATA_LOSS naming the file unless its size and SHA-256 equal `expected`.
absl::Status VerifyFile(const std::string& path, const FileDigest& expected);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_DURABLE_FILE_H_
