// The HDF5 adapter for the datastore files (DESIGN.md "Datastore on disk"):
//   keys.h5:   /keys float16 or float32 [N, d] (float16 as h5py writes it)
//   values.h5: /tokens int32 [N], /offsets int64 [S + 1]
// This file's .cc is the only one that calls HDF5; its exceptions become absl::Status there.
#ifndef KNNSERVE_COMMON_DATASTORE_HDF5_DATASTORE_H_
#define KNNSERVE_COMMON_DATASTORE_HDF5_DATASTORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/datastore/key_source.h"
#include "common/matrix.h"

namespace knnserve {

// Reads /keys of a keys.h5 file. Thread-compatible (the HDF5 library is serial).
class Hdf5KeySource : public KeySource {
 public:
  static absl::StatusOr<std::unique_ptr<Hdf5KeySource>> Open(const std::string& path);
  ~Hdf5KeySource() override;

  int64_t rows() const override { return rows_; }
  int dim() const override { return dim_; }
  bool is_fp16() const { return fp16_; }
  // The SHA-256 of the values.h5 the keys were computed from (`knnserve datastore keys` records
  // it); empty for keys written elsewhere.
  const std::string& values_sha256() const { return values_sha256_; }
  absl::Status Read(int64_t begin, int64_t end, float* out) const override;

 private:
  struct Handles;
  Hdf5KeySource(std::string path, std::unique_ptr<Handles> handles, int64_t rows, int dim,
                bool fp16, std::string values_sha256);

  const std::string path_;
  std::unique_ptr<Handles> handles_;
  const int64_t rows_;
  const int dim_;
  const bool fp16_;
  const std::string values_sha256_;
};

// /tokens and /offsets of a values.h5 file (only those two: the pipeline's values.h5 or a
// minimal one from WriteValuesHdf5), streamed: Open reads the offsets (8 bytes per sentence) and
// validates them against the size of /tokens; Read reads a token range with one hyperslab read.
// Thread-compatible (the HDF5 library is serial).
class Hdf5ValueSource : public ValueSource {
 public:
  // INVALID_ARGUMENT naming the file when a dataset is missing, not 1-D integers, or the offsets
  // are invalid.
  static absl::StatusOr<std::unique_ptr<Hdf5ValueSource>> Open(const std::string& path);
  ~Hdf5ValueSource() override;

  absl::Span<const int64_t> offsets() const override { return offsets_; }
  int64_t num_tokens() const override { return num_tokens_; }
  absl::Status Read(int64_t begin, int64_t end, int32_t* out) const override;

 private:
  struct Handles;
  Hdf5ValueSource(std::string path, std::unique_ptr<Handles> handles, std::vector<int64_t> offsets,
                  int64_t num_tokens);

  const std::string path_;
  std::unique_ptr<Handles> handles_;
  const std::vector<int64_t> offsets_;
  const int64_t num_tokens_;
};

// Reads /tokens and /offsets of a values.h5 file whole (4 bytes per token) and validates them:
// for small callers; an index build streams through Hdf5ValueSource.
absl::StatusOr<DatastoreValues> ReadValuesHdf5(const std::string& path);

// Writers, for tests and tools that make small datastores (the datastore pipeline has its own
// resumable writer). Plain HDF5 writes; not atomic.
absl::Status WriteKeysHdf5(const std::string& path, MatrixView<const float> keys, bool fp16);
absl::Status WriteValuesHdf5(const std::string& path, const DatastoreValues& values);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_HDF5_DATASTORE_H_
