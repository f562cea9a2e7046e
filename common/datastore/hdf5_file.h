// The datastore pipeline's HDF5 adapter: growing 1-D integer datasets (values.h5), fixed [N, d]
// key matrices written in row ranges (keys.h5, resumable), and scalar attributes on the root
// group. This file's .cc is the pipeline's only caller of HDF5; every HDF5 exception becomes an
// absl::Status there, naming the file and the dataset or attribute.
//
// Everything written here is readable by h5py: float16 is IEEE binary16 little-endian (numpy's
// float16), strings are variable-length UTF-8 (h5py returns str).
#ifndef KNNSERVE_COMMON_DATASTORE_HDF5_FILE_H_
#define KNNSERVE_COMMON_DATASTORE_HDF5_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/matrix.h"

namespace knnserve {

enum class Hdf5Type { kInt32, kInt64, kFloat16, kFloat32 };

// One open HDF5 file. Thread-compatible (the HDF5 library is built serial: use one file from one
// thread at a time, and no two Hdf5File objects from different threads concurrently).
class Hdf5File {
 public:
  enum class Mode {
    kCreate,     // create or truncate
    kReadWrite,  // an existing file
    kReadOnly,
  };
  static absl::StatusOr<std::unique_ptr<Hdf5File>> Open(const std::string& path, Mode mode);
  ~Hdf5File();  // closes the file (errors while closing are lost: call Close() to see them)
  Hdf5File(const Hdf5File&) = delete;
  Hdf5File& operator=(const Hdf5File&) = delete;

  const std::string& path() const { return path_; }

  // An empty, growing 1-D dataset of kInt32 or kInt64, stored in chunks of `chunk` elements,
  // deflate-compressed (with byte shuffling) when `compress`.
  absl::Status CreateVector(const std::string& name, Hdf5Type type, int64_t chunk, bool compress);
  // Appends to a dataset made by CreateVector; converts to its stored width.
  absl::Status AppendInt32(const std::string& name, absl::Span<const int32_t> data);
  absl::Status AppendInt64(const std::string& name, absl::Span<const int64_t> data);
  // Reads a whole 1-D integer dataset (any stored integer width).
  absl::StatusOr<std::vector<int32_t>> ReadInt32(const std::string& name) const;
  absl::StatusOr<std::vector<int64_t>> ReadInt64(const std::string& name) const;
  // Reads elements [begin, end) of a 1-D integer dataset with one hyperslab read; OUT_OF_RANGE
  // unless 0 <= begin <= end <= its size.
  absl::StatusOr<std::vector<int32_t>> ReadInt32(const std::string& name, int64_t begin,
                                                 int64_t end) const;

  // A rows x cols matrix of kFloat16 or kFloat32, chunked by `chunk_rows` rows, its storage
  // allocated at creation: later row writes change no metadata, so a process killed while
  // writing leaves a file whose structure is intact.
  absl::Status CreateMatrix(const std::string& name, Hdf5Type type, int64_t rows, int64_t cols,
                            int64_t chunk_rows);
  // Writes rows [begin, begin + rows.rows) of a matrix (converted to its stored type).
  absl::Status WriteRows(const std::string& name, int64_t begin, MatrixView<const float> rows);
  // Reads rows [begin, end) as float; out holds (end - begin) * cols floats.
  absl::Status ReadRows(const std::string& name, int64_t begin, int64_t end, float* out) const;
  // {rows, cols} of a 2-D dataset; {n, 1} of a 1-D one.
  absl::StatusOr<std::pair<int64_t, int64_t>> Shape(const std::string& name) const;
  // The stored type of a dataset.
  absl::StatusOr<Hdf5Type> TypeOf(const std::string& name) const;
  bool HasDataset(const std::string& name) const;

  // Scalar attributes on the root group; Set replaces an existing one.
  absl::Status SetAttribute(const std::string& name, int64_t value);
  absl::Status SetAttribute(const std::string& name, absl::string_view value);
  absl::StatusOr<int64_t> GetIntAttribute(const std::string& name) const;
  absl::StatusOr<std::string> GetStringAttribute(const std::string& name) const;
  bool HasAttribute(const std::string& name) const;

  // Writes every buffered byte and metadata to the file (H5Fflush); does not fsync.
  absl::Status Flush();
  // Closes the file; no other call afterwards.
  absl::Status Close();

 private:
  struct Handles;
  Hdf5File(std::string path, std::unique_ptr<Handles> handles);

  const std::string path_;
  std::unique_ptr<Handles> handles_;
};

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_HDF5_FILE_H_
