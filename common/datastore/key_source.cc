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

absl::Status MemoryValueSource::Read(int64_t begin, int64_t end, int32_t* out) const {
  KNNSERVE_CHECK(0 <= begin && begin <= end && end <= num_tokens(), "token range out of bounds");
  std::copy(values_.tokens.begin() + begin, values_.tokens.begin() + end, out);
  return absl::OkStatus();
}

absl::Status ValidateOffsets(absl::Span<const int64_t> offsets, int64_t num_tokens,
                             absl::string_view offsets_name, absl::string_view tokens_name) {
  if (offsets.empty() || offsets.front() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("values: ", offsets_name, " must start with 0"));
  }
  for (size_t s = 1; s < offsets.size(); ++s) {
    if (offsets[s] < offsets[s - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("values: ", offsets_name, " decrease at sentence ", s - 1));
    }
  }
  if (offsets.back() != num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("values: ", offsets_name, " end at ",
                                                   offsets.back(), " but ", tokens_name, " has ",
                                                   num_tokens));
  }
  return absl::OkStatus();
}

}  // namespace knnserve
