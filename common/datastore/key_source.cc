#include "common/datastore/key_source.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace knnserve {

absl::Status MatrixKeySource::Read(int64_t begin, int64_t end, float* out) const {
  KNNSERVE_CHECK(0 <= begin && begin <= end && end <= keys_.rows, "row range out of bounds");
  std::copy(keys_.row(begin), keys_.row(end), out);
  return absl::OkStatus();
}

absl::Status DatastoreValues::Validate() const {
  if (offsets.empty() || offsets.front() != 0) {
    return absl::InvalidArgumentError("values: /offsets must start with 0");
  }
  for (size_t s = 1; s < offsets.size(); ++s) {
    if (offsets[s] < offsets[s - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("values: /offsets decrease at sentence ", s - 1));
    }
  }
  if (offsets.back() != static_cast<int64_t>(tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat("values: /offsets end at ", offsets.back(),
                                                   " but /tokens has ", tokens.size()));
  }
  return absl::OkStatus();
}

}  // namespace knnserve
