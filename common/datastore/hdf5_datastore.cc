// The one file that calls HDF5. Every entry point runs inside Guard(), which turns
// H5::Exception into an absl::Status naming the file.
#include "common/datastore/hdf5_datastore.h"

#include <H5Cpp.h>

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/datastore/hdf5_guard.h"
#include "common/check.h"
#include "common/half.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

using hdf5_internal::Guard;
using hdf5_internal::HalfType;

template <typename T>
absl::Status ReadVector(const H5::H5File& file, const char* name, const H5::PredType& type,
                        std::vector<T>& out) {
  H5::DataSet ds = file.openDataSet(name);
  H5::DataSpace space = ds.getSpace();
  if (space.getSimpleExtentNdims() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be one-dimensional"));
  }
  if (ds.getTypeClass() != H5T_INTEGER) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must hold integers"));
  }
  hsize_t n = 0;
  space.getSimpleExtentDims(&n);
  out.resize(n);
  if (n > 0) ds.read(out.data(), type);  // HDF5 converts integer widths
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
                             int dim, bool fp16)
    : path_(std::move(path)), handles_(std::move(handles)), rows_(rows), dim_(dim), fp16_(fp16) {}

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
    source.reset(new Hdf5KeySource(path, std::move(handles), static_cast<int64_t>(dims[0]),
                                   static_cast<int>(dims[1]), type.getSize() == 2));
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

absl::StatusOr<DatastoreValues> ReadValuesHdf5(const std::string& path) {
  DatastoreValues values;
  RETURN_IF_ERROR(Guard(path, "read values", [&]() -> absl::Status {
    H5::H5File file(path, H5F_ACC_RDONLY);
    RETURN_IF_ERROR(ReadVector(file, "/tokens", H5::PredType::NATIVE_INT32, values.tokens));
    return ReadVector(file, "/offsets", H5::PredType::NATIVE_INT64, values.offsets);
  }));
  if (absl::Status s = values.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
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
