// Where an index build reads its keys and values from: the datastore's HDF5 files
// (hdf5_datastore.h) or, in tests and embedded use, vectors already in memory.
#ifndef KNNSERVE_COMMON_DATASTORE_KEY_SOURCE_H_
#define KNNSERVE_COMMON_DATASTORE_KEY_SOURCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/matrix.h"

namespace knnserve {

// rows() x dim() float keys, read in row ranges. Thread-compatible (HDF5 is serial).
class KeySource {
 public:
  virtual ~KeySource() = default;
  virtual int64_t rows() const = 0;
  virtual int dim() const = 0;
  // Reads rows [begin, end) into out ((end - begin) x dim() floats).
  // REQUIRES: 0 <= begin <= end <= rows().
  virtual absl::Status Read(int64_t begin, int64_t end, float* out) const = 0;
};

// Keys borrowed from memory; `keys` must outlive the source.
class MatrixKeySource : public KeySource {
 public:
  explicit MatrixKeySource(MatrixView<const float> keys) : keys_(keys) {}
  int64_t rows() const override { return keys_.rows; }
  int dim() const override { return static_cast<int>(keys_.cols); }
  absl::Status Read(int64_t begin, int64_t end, float* out) const override;

 private:
  MatrixView<const float> keys_;
};

// The value side of a datastore (DESIGN.md, values.h5): tokens[i] is the value of key i;
// sentence s holds the tokens [offsets[s], offsets[s + 1]).
struct DatastoreValues {
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets;  // num_sentences() + 1 entries, offsets[0] == 0

  int64_t num_sentences() const { return static_cast<int64_t>(offsets.size()) - 1; }
};

// The target side of a datastore as an index build reads it: the sentence offsets in memory (8
// bytes per sentence), the tokens read by token range, so that no caller needs them all at once.
// Implementations: MemoryValueSource below; streaming, Hdf5ValueSource (hdf5_datastore.h, a plain
// /tokens + /offsets file) and TargetValueSource (values_file.h, the pipeline's values.h5).
// Thread-compatible, like KeySource: Read may read a file.
class ValueSource {
 public:
  virtual ~ValueSource() = default;
  // Sentence s holds the tokens [offsets()[s], offsets()[s + 1]). Owned by the source and valid
  // while it lives. A source does not promise valid offsets: check them against num_tokens()
  // with ValidateOffsets before use.
  virtual absl::Span<const int64_t> offsets() const = 0;
  int64_t num_sentences() const { return static_cast<int64_t>(offsets().size()) - 1; }
  // How many tokens the source holds (offsets().back() when the offsets are valid).
  virtual int64_t num_tokens() const = 0;
  // Reads tokens [begin, end) into out (end - begin int32s); a file's read errors (or, for
  // values.h5, an id outside the vocabulary) come back naming the file.
  // REQUIRES: 0 <= begin <= end <= num_tokens().
  virtual absl::Status Read(int64_t begin, int64_t end, int32_t* out) const = 0;
};

// Values borrowed from memory; `values` must outlive the source.
class MemoryValueSource : public ValueSource {
 public:
  explicit MemoryValueSource(const DatastoreValues& values) : values_(values) {}
  absl::Span<const int64_t> offsets() const override { return values_.offsets; }
  int64_t num_tokens() const override { return static_cast<int64_t>(values_.tokens.size()); }
  absl::Status Read(int64_t begin, int64_t end, int32_t* out) const override;

 private:
  const DatastoreValues& values_;
};

// INVALID_ARGUMENT unless `offsets` (of the dataset `offsets_name`) is non-empty, starts at 0,
// never decreases and ends at `num_tokens` (the size of `tokens_name`); the error names both
// datasets.
absl::Status ValidateOffsets(absl::Span<const int64_t> offsets, int64_t num_tokens,
                             absl::string_view offsets_name, absl::string_view tokens_name);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_DATASTORE_KEY_SOURCE_H_
