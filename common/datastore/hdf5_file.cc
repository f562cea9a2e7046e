// The only file of the datastore pipeline that calls HDF5. Every entry point runs inside
// Guard(), which turns HDF5's exceptions into an absl::Status naming the file and the object.
#include "common/datastore/hdf5_file.h"

#include <H5Cpp.h>
#include <stdlib.h>  // on_exit

#include <algorithm>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/datastore/hdf5_guard.h"
#include "common/half.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

using hdf5_internal::Guard;
using hdf5_internal::HalfType;

#ifdef __GLIBC__
// An exit handler: ends the process with its exit status before HDF5's C++ library closes what
// is still open (its own exit handler, registered when the library was loaded, runs later).
// Every exit handler registered before this one is skipped with it, on purpose: static
// destructors, a sanitizer's leak check; the process has failed a write and is ending anyway.
void ExitBeforeHdf5Closes(int status, void* /*unused*/) {
  std::fflush(nullptr);
  std::_Exit(status);
}
#endif

H5::DataType FileType(Hdf5Type type) {
  switch (type) {
    case Hdf5Type::kInt32:
      return H5::PredType::STD_I32LE;
    case Hdf5Type::kInt64:
      return H5::PredType::STD_I64LE;
    case Hdf5Type::kFloat16:
      return HalfType();
    case Hdf5Type::kFloat32:
      return H5::PredType::IEEE_F32LE;
  }
  return H5::PredType::STD_I32LE;
}

template <typename T>
const H5::PredType& NativeType();
template <>
const H5::PredType& NativeType<int32_t>() {
  return H5::PredType::NATIVE_INT32;
}
template <>
const H5::PredType& NativeType<int64_t>() {
  return H5::PredType::NATIVE_INT64;
}

template <typename T>
void Append(H5::DataSet& ds, absl::Span<const T> data) {
  if (data.empty()) return;
  H5::DataSpace space = ds.getSpace();
  hsize_t old_size = 0;
  space.getSimpleExtentDims(&old_size);
  const hsize_t count = data.size();
  const hsize_t new_size = old_size + count;
  ds.extend(&new_size);
  H5::DataSpace file_space = ds.getSpace();
  file_space.selectHyperslab(H5S_SELECT_SET, &count, &old_size);
  H5::DataSpace mem_space(1, &count);
  ds.write(data.data(), NativeType<T>(), mem_space, file_space);
}

// Elements [begin, end) of a 1-D integer dataset in one hyperslab read, or all when no range.
template <typename T>
absl::StatusOr<std::vector<T>> ReadVector(const H5::H5File& file, const std::string& path,
                                          const std::string& name,
                                          std::optional<std::pair<int64_t, int64_t>> range) {
  std::vector<T> out;
  RETURN_IF_ERROR(Guard(path, absl::StrCat("read ", name), [&]() -> absl::Status {
    H5::DataSet ds = file.openDataSet(name);
    H5::DataSpace space = ds.getSpace();
    if (space.getSimpleExtentNdims() != 1 || ds.getTypeClass() != H5T_INTEGER) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", name, " must be a one-dimensional integer dataset"));
    }
    hsize_t n = 0;
    space.getSimpleExtentDims(&n);
    const auto [begin, end] = range.value_or(std::pair<int64_t, int64_t>(0, n));
    if (begin < 0 || end < begin || static_cast<hsize_t>(end) > n) {
      return absl::OutOfRangeError(absl::StrCat(path, ": ", name, " has ", n,
                                                " elements, cannot read [", begin, ", ", end, ")"));
    }
    const hsize_t start = static_cast<hsize_t>(begin);
    const hsize_t count = static_cast<hsize_t>(end - begin);
    out.resize(count);
    if (count == 0) return absl::OkStatus();
    space.selectHyperslab(H5S_SELECT_SET, &count, &start);
    H5::DataSpace mem_space(1, &count);
    ds.read(out.data(), NativeType<T>(), mem_space, space);  // HDF5 converts integer widths
    return absl::OkStatus();
  }));
  return out;
}

// Rows [begin, begin + count) x all columns of a 2-D dataset.
H5::DataSpace SelectRows(const H5::DataSet& ds, int64_t begin, int64_t count, int64_t cols) {
  H5::DataSpace space = ds.getSpace();
  const hsize_t start[2] = {static_cast<hsize_t>(begin), 0};
  const hsize_t size[2] = {static_cast<hsize_t>(count), static_cast<hsize_t>(cols)};
  space.selectHyperslab(H5S_SELECT_SET, size, start);
  return space;
}

}  // namespace

struct Hdf5File::Handles {
  explicit Handles(H5::H5File f) : file(std::move(f)) {}
  H5::H5File file;
  bool open = true;
};

Hdf5File::Hdf5File(std::string path, std::unique_ptr<Handles> handles)
    : path_(std::move(path)), handles_(std::move(handles)) {}

Hdf5File::~Hdf5File() { (void)Close(); }

absl::StatusOr<std::unique_ptr<Hdf5File>> Hdf5File::Open(const std::string& path, Mode mode) {
  std::unique_ptr<Handles> handles;
  RETURN_IF_ERROR(Guard(path, "open", [&]() -> absl::Status {
    const unsigned flags = mode == Mode::kCreate      ? H5F_ACC_TRUNC
                           : mode == Mode::kReadWrite ? H5F_ACC_RDWR
                                                      : H5F_ACC_RDONLY;
    H5::FileCreatPropList create_props;
    H5Pset_obj_track_times(create_props.getId(), false);  // the root group's timestamps too
    handles = std::make_unique<Handles>(H5::H5File(path, flags, create_props));
    return absl::OkStatus();
  }));
  return std::unique_ptr<Hdf5File>(new Hdf5File(path, std::move(handles)));
}

absl::Status Hdf5File::CreateVector(const std::string& name, Hdf5Type type, int64_t chunk,
                                    bool compress) {
  return Guard(path_, absl::StrCat("create ", name), [&]() -> absl::Status {
    if (type != Hdf5Type::kInt32 && type != Hdf5Type::kInt64) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": vectors hold integers only"));
    }
    const hsize_t zero = 0;
    const hsize_t unlimited = H5S_UNLIMITED;
    H5::DataSpace space(1, &zero, &unlimited);
    H5::DSetCreatPropList props;
    const hsize_t chunk_size = static_cast<hsize_t>(std::max<int64_t>(chunk, 1));
    props.setChunk(1, &chunk_size);
    H5Pset_obj_track_times(props.getId(), false);  // no timestamps: same data, same bytes
    if (compress) {
      props.setShuffle();
      props.setDeflate(4);
    }
    handles_->file.createDataSet(name, FileType(type), space, props);
    return absl::OkStatus();
  });
}

absl::Status Hdf5File::AppendInt32(const std::string& name, absl::Span<const int32_t> data) {
  return Guard(path_, absl::StrCat("append to ", name), [&]() -> absl::Status {
    H5::DataSet ds = handles_->file.openDataSet(name);
    Append(ds, data);
    return absl::OkStatus();
  });
}

absl::Status Hdf5File::AppendInt64(const std::string& name, absl::Span<const int64_t> data) {
  return Guard(path_, absl::StrCat("append to ", name), [&]() -> absl::Status {
    H5::DataSet ds = handles_->file.openDataSet(name);
    Append(ds, data);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<int32_t>> Hdf5File::ReadInt32(const std::string& name) const {
  return ReadVector<int32_t>(handles_->file, path_, name, std::nullopt);
}

absl::StatusOr<std::vector<int64_t>> Hdf5File::ReadInt64(const std::string& name) const {
  return ReadVector<int64_t>(handles_->file, path_, name, std::nullopt);
}

absl::StatusOr<std::vector<int32_t>> Hdf5File::ReadInt32(const std::string& name, int64_t begin,
                                                         int64_t end) const {
  return ReadVector<int32_t>(handles_->file, path_, name, std::make_pair(begin, end));
}

absl::Status Hdf5File::CreateMatrix(const std::string& name, Hdf5Type type, int64_t rows,
                                    int64_t cols, int64_t chunk_rows) {
  return Guard(path_, absl::StrCat("create ", name), [&]() -> absl::Status {
    if (type != Hdf5Type::kFloat16 && type != Hdf5Type::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": matrices hold floats only"));
    }
    if (rows < 0 || cols <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": bad matrix shape [", rows, ", ", cols, "]"));
    }
    const hsize_t dims[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)};
    H5::DataSpace space(2, dims);
    H5::DSetCreatPropList props;
    if (rows > 0) {
      const hsize_t chunk[2] = {static_cast<hsize_t>(std::clamp<int64_t>(chunk_rows, 1, rows)),
                                dims[1]};
      props.setChunk(2, chunk);
      H5Pset_obj_track_times(props.getId(), false);
      // Storage allocated now: row writes later touch raw data only, never the chunk index.
      H5Pset_alloc_time(props.getId(), H5D_ALLOC_TIME_EARLY);
      H5Pset_fill_time(props.getId(), H5D_FILL_TIME_NEVER);
    }
    handles_->file.createDataSet(name, FileType(type), space, props);
    return absl::OkStatus();
  });
}

absl::Status Hdf5File::WriteRows(const std::string& name, int64_t begin,
                                 MatrixView<const float> rows) {
  if (rows.rows == 0) return absl::OkStatus();
  return Guard(path_, absl::StrCat("write ", name, " rows from ", begin), [&]() -> absl::Status {
    H5::DataSet ds = handles_->file.openDataSet(name);
    hsize_t dims[2] = {0, 0};
    H5::DataSpace space = ds.getSpace();
    if (space.getSimpleExtentNdims() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(name, " is not a matrix"));
    }
    space.getSimpleExtentDims(dims);
    if (static_cast<hsize_t>(rows.cols) != dims[1] || begin < 0 ||
        static_cast<hsize_t>(begin + rows.rows) > dims[0]) {
      return absl::InvalidArgumentError(absl::StrCat(name, " is [", dims[0], ", ", dims[1],
                                                     "]: cannot write ", rows.rows, " x ",
                                                     rows.cols, " at row ", begin));
    }
    H5::DataSpace file_space = SelectRows(ds, begin, rows.rows, rows.cols);
    const hsize_t count[2] = {static_cast<hsize_t>(rows.rows), dims[1]};
    H5::DataSpace mem_space(2, count);
    if (ds.getDataType().getSize() == 2) {
      // Narrow with F16C here: HDF5's own float conversion is much slower.
      std::vector<uint16_t> halves(rows.size());
      FloatsToHalves(rows.data, halves.size(), halves.data());
      ds.write(halves.data(), HalfType(), mem_space, file_space);
    } else {
      ds.write(rows.data, H5::PredType::NATIVE_FLOAT, mem_space, file_space);
    }
    return absl::OkStatus();
  });
}

absl::Status Hdf5File::ReadRows(const std::string& name, int64_t begin, int64_t end,
                                float* out) const {
  if (begin == end) return absl::OkStatus();
  return Guard(path_, absl::StrCat("read ", name, " rows [", begin, ", ", end, ")"),
               [&]() -> absl::Status {
                 H5::DataSet ds = handles_->file.openDataSet(name);
                 hsize_t dims[2] = {0, 0};
                 ds.getSpace().getSimpleExtentDims(dims);
                 if (begin < 0 || end < begin || static_cast<hsize_t>(end) > dims[0]) {
                   return absl::OutOfRangeError(absl::StrCat(name, " has ", dims[0], " rows"));
                 }
                 H5::DataSpace file_space = SelectRows(ds, begin, end - begin, dims[1]);
                 const hsize_t count[2] = {static_cast<hsize_t>(end - begin), dims[1]};
                 H5::DataSpace mem_space(2, count);
                 const size_t n = count[0] * count[1];
                 if (ds.getDataType().getSize() == 2) {
                   std::vector<uint16_t> halves(n);
                   ds.read(halves.data(), HalfType(), mem_space, file_space);
                   HalvesToFloats(halves.data(), n, out);
                 } else {
                   ds.read(out, H5::PredType::NATIVE_FLOAT, mem_space, file_space);
                 }
                 return absl::OkStatus();
               });
}

absl::StatusOr<std::pair<int64_t, int64_t>> Hdf5File::Shape(const std::string& name) const {
  std::pair<int64_t, int64_t> shape{0, 1};
  RETURN_IF_ERROR(Guard(path_, absl::StrCat("shape of ", name), [&]() -> absl::Status {
    H5::DataSpace space = handles_->file.openDataSet(name).getSpace();
    const int rank = space.getSimpleExtentNdims();
    if (rank != 1 && rank != 2) {
      return absl::InvalidArgumentError(absl::StrCat(name, " has rank ", rank));
    }
    hsize_t dims[2] = {0, 1};
    space.getSimpleExtentDims(dims);
    shape = {static_cast<int64_t>(dims[0]), static_cast<int64_t>(dims[1])};
    return absl::OkStatus();
  }));
  return shape;
}

absl::StatusOr<Hdf5Type> Hdf5File::TypeOf(const std::string& name) const {
  Hdf5Type type = Hdf5Type::kInt32;
  RETURN_IF_ERROR(Guard(path_, absl::StrCat("type of ", name), [&]() -> absl::Status {
    H5::DataSet ds = handles_->file.openDataSet(name);
    const size_t size = ds.getDataType().getSize();
    const H5T_class_t type_class = ds.getTypeClass();
    if (type_class == H5T_INTEGER && (size == 4 || size == 8)) {
      type = size == 4 ? Hdf5Type::kInt32 : Hdf5Type::kInt64;
    } else if (type_class == H5T_FLOAT && (size == 2 || size == 4)) {
      type = size == 2 ? Hdf5Type::kFloat16 : Hdf5Type::kFloat32;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(name, " has an unsupported type"));
    }
    return absl::OkStatus();
  }));
  return type;
}

bool Hdf5File::HasDataset(const std::string& name) const {
  return Guard(path_, "",
               [&]() -> absl::Status {
                 return handles_->file.nameExists(name) ? absl::OkStatus()
                                                        : absl::NotFoundError("");
               })
      .ok();
}

absl::Status Hdf5File::SetAttribute(const std::string& name, int64_t value) {
  return Guard(path_, absl::StrCat("set attribute ", name), [&]() -> absl::Status {
    H5::Group root = handles_->file.openGroup("/");
    if (root.attrExists(name)) {
      H5::Attribute attr = root.openAttribute(name);
      if (attr.getTypeClass() == H5T_INTEGER) {
        attr.write(H5::PredType::NATIVE_INT64, &value);  // in place: no metadata reallocation
        return absl::OkStatus();
      }
      root.removeAttr(name);
    }
    H5::Attribute attr =
        root.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR));
    attr.write(H5::PredType::NATIVE_INT64, &value);
    return absl::OkStatus();
  });
}

absl::Status Hdf5File::SetAttribute(const std::string& name, absl::string_view value) {
  return Guard(path_, absl::StrCat("set attribute ", name), [&]() -> absl::Status {
    H5::Group root = handles_->file.openGroup("/");
    if (root.attrExists(name)) root.removeAttr(name);
    H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
    type.setCset(H5T_CSET_UTF8);
    H5::Attribute attr = root.createAttribute(name, type, H5::DataSpace(H5S_SCALAR));
    attr.write(type, std::string(value));
    return absl::OkStatus();
  });
}

absl::StatusOr<int64_t> Hdf5File::GetIntAttribute(const std::string& name) const {
  int64_t value = 0;
  RETURN_IF_ERROR(Guard(path_, absl::StrCat("read attribute ", name), [&]() -> absl::Status {
    H5::Attribute attr = handles_->file.openGroup("/").openAttribute(name);
    if (attr.getTypeClass() != H5T_INTEGER) {
      return absl::InvalidArgumentError(absl::StrCat("attribute ", name, " is not an integer"));
    }
    attr.read(H5::PredType::NATIVE_INT64, &value);
    return absl::OkStatus();
  }));
  return value;
}

absl::StatusOr<std::string> Hdf5File::GetStringAttribute(const std::string& name) const {
  std::string value;
  RETURN_IF_ERROR(Guard(path_, absl::StrCat("read attribute ", name), [&]() -> absl::Status {
    H5::Attribute attr = handles_->file.openGroup("/").openAttribute(name);
    if (attr.getTypeClass() != H5T_STRING) {
      return absl::InvalidArgumentError(absl::StrCat("attribute ", name, " is not a string"));
    }
    attr.read(attr.getStrType(), value);
    return absl::OkStatus();
  }));
  return value;
}

bool Hdf5File::HasAttribute(const std::string& name) const {
  return Guard(path_, "",
               [&]() -> absl::Status {
                 return handles_->file.openGroup("/").attrExists(name) ? absl::OkStatus()
                                                                       : absl::NotFoundError("");
               })
      .ok();
}

absl::Status Hdf5File::Flush() {
  return Guard(path_, "flush", [&]() -> absl::Status {
    handles_->file.flush(H5F_SCOPE_GLOBAL);
    return absl::OkStatus();
  });
}

absl::Status Hdf5File::Close() {
  if (handles_ == nullptr || !handles_->open) return absl::OkStatus();
  handles_->open = false;
  absl::Status status = Guard(path_, "close", [&]() -> absl::Status {
    handles_->file.close();
    return absl::OkStatus();
  });
  if (!status.ok()) {
    // HDF5 1.10 crashes when a file whose close failed (a write error while flushing its
    // cache, e.g. a full disk) is closed again, as H5File's destructor would: abandon the
    // handle instead. The file is a .partial or temporary output that is never published. The
    // library would still close it when the process exits, and crash there (SIGSEGV after the
    // error message, instead of the exit status the caller chose): from now on the process
    // exits without letting it. on_exit (glibc) hands the handler that status; handlers run
    // in reverse order of registration, so this one runs before the library's.
    (void)handles_.release();
#ifdef __GLIBC__
    static std::once_flag registered;
    std::call_once(registered, [] { ::on_exit(ExitBeforeHdf5Closes, nullptr); });
#endif
  }
  return status;
}

}  // namespace knnserve
