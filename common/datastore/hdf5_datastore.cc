// The one file that calls HDF5. Every entry point runs inside Guard(), which turns
// H5::Exception into an absl::Status naming the file.
#include "common/datastore/hdf5_datastore.h"

#include <H5Cpp.h>

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/datastore/hdf5_guard.h"
#include "common/half.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

using hdf5_internal::Guard;
using hdf5_internal::HalfType;

// The size of `ds`, the dataset `name`, unless it is not a 1-D integer dataset.
absl::StatusOr<hsize_t> IntegerVectorSize(const H5::DataSet& ds, const char* name) {
  H5::DataSpace space = ds.getSpace();
  if (space.getSimpleExtentNdims() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be one-dimensional"));
  }
  if (ds.getTypeClass() != H5T_INTEGER) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must hold integers"));
  }
  hsize_t n = 0;
  space.getSimpleExtentDims(&n);
  return n;
}

absl::Status ReadInt64Vector(const H5::H5File& file, const char* name, std::vector<int64_t>& out) {
  H5::DataSet ds = file.openDataSet(name);
  ASSIGN_OR_RETURN(const hsize_t n, IntegerVectorSize(ds, name));
  out.resize(n);
  if (n > 0) ds.read(out.data(), H5::PredType::NATIVE_INT64);  // HDF5 converts integer widths
  return absl::OkStatus();
}

template <typename T>
void WriteVector(H5::H5File& file, const char* name, const H5::PredType& type,
                 const std::vector<T>& data) {
  const hsize_t n = data.size();
  H5::DataSpace space(1, &n);
  H5::DataSet ds = file.createDataSet(name, type, space);
  if (n > 0) ds.write(data.data(), type);
}

}  // namespace

struct Hdf5KeySource::Handles {
  H5::H5File file;
  H5::DataSet keys;
};

Hdf5KeySource::Hdf5KeySource(std::string path, std::unique_ptr<Handles> handles, int64_t rows,
                             int dim, bool fp16, std::string values_sha256)
    : path_(std::move(path)),
      handles_(std::move(handles)),
      rows_(rows),
      dim_(dim),
      fp16_(fp16),
      values_sha256_(std::move(values_sha256)) {}

Hdf5KeySource::~Hdf5KeySource() = default;

absl::StatusOr<std::unique_ptr<Hdf5KeySource>> Hdf5KeySource::Open(const std::string& path) {
  std::unique_ptr<Hdf5KeySource> source;
  RETURN_IF_ERROR(Guard(path, "open /keys", [&]() -> absl::Status {
    auto handles = std::make_unique<Handles>();
    handles->file.openFile(path, H5F_ACC_RDONLY);
    handles->keys = handles->file.openDataSet("/keys");
    H5::DataSpace space = handles->keys.getSpace();
    if (space.getSimpleExtentNdims() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": /keys must be [N, d]"));
    }
    hsize_t dims[2];
    space.getSimpleExtentDims(dims);
    const H5::DataType type = handles->keys.getDataType();
    if (type.getClass() != H5T_FLOAT || (type.getSize() != 2 && type.getSize() != 4)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": /keys must be float16 or float32"));
    }
    // Keys of `knnserve datastore keys` say whether every row was computed; a file still being
    // computed (or interrupted) holds arbitrary bytes past rows_completed.
    if (handles->file.attrExists("complete")) {
      int64_t complete = 0;
      handles->file.openAttribute("complete").read(H5::PredType::NATIVE_INT64, &complete);
      if (complete != 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            path,
            " is not complete (a keys computation still running or interrupted): finish "
            "it with `knnserve datastore keys` first"));
      }
    }
    std::string values_sha256;
    if (handles->file.attrExists("values_sha256")) {
      const H5::Attribute attribute = handles->file.openAttribute("values_sha256");
      attribute.read(attribute.getStrType(), values_sha256);
    }
    source.reset(new Hdf5KeySource(path, std::move(handles), static_cast<int64_t>(dims[0]),
                                   static_cast<int>(dims[1]), type.getSize() == 2,
                                   std::move(values_sha256)));
    return absl::OkStatus();
  }));
  return source;
}

absl::Status Hdf5KeySource::Read(int64_t begin, int64_t end, float* out) const {
  KNNSERVE_CHECK(0 <= begin && begin <= end && end <= rows_, "row range out of bounds");
  if (begin == end) return absl::OkStatus();
  return Guard(
      path_, absl::StrCat("read /keys rows [", begin, ", ", end, ")"), [&]() -> absl::Status {
        const hsize_t count[2] = {static_cast<hsize_t>(end - begin), static_cast<hsize_t>(dim_)};
        const hsize_t start[2] = {static_cast<hsize_t>(begin), 0};
        H5::DataSpace file_space = handles_->keys.getSpace();
        file_space.selectHyperslab(H5S_SELECT_SET, count, start);
        H5::DataSpace mem_space(2, count);
        const size_t n = count[0] * count[1];
        if (fp16_) {
          // Read the halves raw and widen them with F16C: much faster than HDF5's
          // soft float conversion.
          std::vector<uint16_t> halves(n);
          handles_->keys.read(halves.data(), HalfType(), mem_space, file_space);
          HalvesToFloats(halves.data(), n, out);
        } else {
          handles_->keys.read(out, H5::PredType::NATIVE_FLOAT, mem_space, file_space);
        }
        return absl::OkStatus();
      });
}

struct Hdf5ValueSource::Handles {
  H5::H5File file;
  H5::DataSet tokens;
};

Hdf5ValueSource::Hdf5ValueSource(std::string path, std::unique_ptr<Handles> handles,
                                 std::vector<int64_t> offsets, int64_t num_tokens)
    : path_(std::move(path)),
      handles_(std::move(handles)),
      offsets_(std::move(offsets)),
      num_tokens_(num_tokens) {}

Hdf5ValueSource::~Hdf5ValueSource() = default;

absl::StatusOr<std::unique_ptr<Hdf5ValueSource>> Hdf5ValueSource::Open(const std::string& path) {
  std::unique_ptr<Hdf5ValueSource> source;
  RETURN_IF_ERROR(Guard(path, "open values", [&]() -> absl::Status {
    auto handles = std::make_unique<Handles>();
    handles->file.openFile(path, H5F_ACC_RDONLY);
    handles->tokens = handles->file.openDataSet("/tokens");
    ASSIGN_OR_RETURN(const hsize_t num_tokens, IntegerVectorSize(handles->tokens, "/tokens"));
    std::vector<int64_t> offsets;
    RETURN_IF_ERROR(ReadInt64Vector(handles->file, "/offsets", offsets));
    source.reset(new Hdf5ValueSource(path, std::move(handles), std::move(offsets),
                                     static_cast<int64_t>(num_tokens)));
    return absl::OkStatus();
  }));
  if (absl::Status s =
          ValidateOffsets(source->offsets_, source->num_tokens_, "/offsets", "/tokens");
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return source;
}

absl::Status Hdf5ValueSource::Read(int64_t begin, int64_t end, int32_t* out) const {
  KNNSERVE_CHECK(0 <= begin && begin <= end && end <= num_tokens_, "token range out of bounds");
  if (begin == end) return absl::OkStatus();
  return Guard(path_, absl::StrCat("read /tokens [", begin, ", ", end, ")"), [&]() -> absl::Status {
    const hsize_t count = static_cast<hsize_t>(end - begin);
    const hsize_t start = static_cast<hsize_t>(begin);
    H5::DataSpace file_space = handles_->tokens.getSpace();
    file_space.selectHyperslab(H5S_SELECT_SET, &count, &start);
    H5::DataSpace mem_space(1, &count);
    handles_->tokens.read(out, H5::PredType::NATIVE_INT32, mem_space, file_space);
    return absl::OkStatus();
  });
}

absl::StatusOr<DatastoreValues> ReadValuesHdf5(const std::string& path) {
  ASSIGN_OR_RETURN(const std::unique_ptr<Hdf5ValueSource> source, Hdf5ValueSource::Open(path));
  DatastoreValues values;
  values.offsets.assign(source->offsets().begin(), source->offsets().end());
  values.tokens.resize(source->num_tokens());
  RETURN_IF_ERROR(source->Read(0, source->num_tokens(), values.tokens.data()));
  return values;
}

absl::Status WriteKeysHdf5(const std::string& path, MatrixView<const float> keys, bool fp16) {
  return Guard(path, "write /keys", [&]() -> absl::Status {
    H5::H5File file(path, H5F_ACC_TRUNC);
    const hsize_t dims[2] = {static_cast<hsize_t>(keys.rows), static_cast<hsize_t>(keys.cols)};
    H5::DataSpace space(2, dims);
    H5::DSetCreatPropList props;
    if (keys.rows > 0 && keys.cols > 0) {
      const hsize_t chunk[2] = {std::min<hsize_t>(dims[0], 4096), dims[1]};
      props.setChunk(2, chunk);
    }
    if (fp16) {
      const H5::FloatType half = HalfType();
      std::vector<uint16_t> halves(keys.size());
      FloatsToHalves(keys.data, halves.size(), halves.data());
      H5::DataSet ds = file.createDataSet("/keys", half, space, props);
      if (!halves.empty()) ds.write(halves.data(), half);
    } else {
      H5::DataSet ds = file.createDataSet("/keys", H5::PredType::IEEE_F32LE, space, props);
      if (keys.size() > 0) ds.write(keys.data, H5::PredType::NATIVE_FLOAT);
    }
    return absl::OkStatus();
  });
}

absl::Status WriteValuesHdf5(const std::string& path, const DatastoreValues& values) {
  return Guard(path, "write values", [&]() -> absl::Status {
    H5::H5File file(path, H5F_ACC_TRUNC);
    WriteVector(file, "/tokens", H5::PredType::NATIVE_INT32, values.tokens);
    WriteVector(file, "/offsets", H5::PredType::NATIVE_INT64, values.offsets);
    return absl::OkStatus();
  });
}

}  // namespace knnserve
