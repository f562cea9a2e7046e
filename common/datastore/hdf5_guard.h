// Private to the two HDF5 adapter files (hdf5_datastore.cc, hdf5_file.cc): turns HDF5 C++
// exceptions into absl::Status, and the fp16 type h5py writes. Include only from .cc files that
// already call HDF5.
#ifndef KNNSERVE_COMMON_DATASTORE_HDF5_GUARD_H_
#define KNNSERVE_COMMON_DATASTORE_HDF5_GUARD_H_

#include <H5Cpp.h>

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace knnserve::hdf5_internal {

// Runs `body` (returning absl::Status); HDF5 errors become INVALID_ARGUMENT naming the file and
// the operation `what`, other exceptions INTERNAL.
template <typename Body>
absl::Status Guard(const std::string& path, absl::string_view what, Body&& body) {
  H5::Exception::dontPrint();  // errors come back as Status, not as HDF5's stderr trace
  try {
    return body();
  } catch (const H5::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", what, ": ", e.getFuncName(), ": ", e.getDetailMsg()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(path, ": ", what, ": ", e.what()));
  }
}

// IEEE binary16 little-endian, as h5py defines it (numpy float16).
inline H5::FloatType HalfType() {
  H5::FloatType type(H5::PredType::IEEE_F32LE);
  type.setFields(15, 10, 5, 0, 10);
  type.setSize(2);
  type.setEbias(15);
  return type;
}

}  // namespace knnserve::hdf5_internal

#endif  // KNNSERVE_COMMON_DATASTORE_HDF5_GUARD_H_
