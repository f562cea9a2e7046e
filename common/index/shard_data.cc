#include "common/index/shard_data.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace knnserve {
namespace {

constexpr char kValuesMagic[] = "KNSVALS1";
constexpr char kCodesMagic[] = "KNSCODE1";
constexpr size_t kMagicSize = 8;

// Appends raw little-endian bytes (x86-64 and aarch64 are both little-endian).
template <typename T>
void Put(std::string& out, const T* data, size_t count) {
  out.append(reinterpret_cast<const char*>(data), count * sizeof(T));
}
template <typename T>
void Put(std::string& out, T value) {
  Put(out, &value, 1);
}

// Reads a file front to back, failing with the file name when it runs short.
class Reader {
 public:
  Reader(absl::Span<const uint8_t> bytes, const std::string& source)
      : bytes_(bytes), source_(source) {}

  absl::Status Magic(const char* magic) {
    if (bytes_.size() < kMagicSize || std::memcmp(bytes_.data(), magic, kMagicSize) != 0) {
      return absl::DataLossError(absl::StrCat(source_, ": not a ", magic, " file"));
    }
    pos_ = kMagicSize;
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status Get(T* out, size_t count) {
    const size_t size = count * sizeof(T);
    if (count > bytes_.size() || bytes_.size() - pos_ < size) {
      return absl::DataLossError(absl::StrCat(source_, ": truncated at byte ", pos_));
    }
    std::memcpy(out, bytes_.data() + pos_, size);
    pos_ += size;
    return absl::OkStatus();
  }
  size_t remaining() const { return bytes_.size() - pos_; }
  // DATA_LOSS unless exactly `expected` bytes are left (checked before allocating for them).
  absl::Status Expect(uint64_t expected) const {
    if (expected != remaining()) {
      return absl::DataLossError(absl::StrCat(source_, ": header promises ", expected,
                                              " more bytes, the file has ", remaining()));
    }
    return absl::OkStatus();
  }
  absl::Status AtEnd() const {
    if (pos_ != bytes_.size()) {
      return absl::DataLossError(
          absl::StrCat(source_, ": ", bytes_.size() - pos_, " unexpected trailing bytes"));
    }
    return absl::OkStatus();
  }

 private:
  absl::Span<const uint8_t> bytes_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

std::string ValuesHeader(int64_t count) {
  std::string out(kValuesMagic, kMagicSize);
  Put<int64_t>(out, count);
  return out;
}

std::string SerializeValues(absl::Span<const int32_t> values) {
  std::string out = ValuesHeader(static_cast<int64_t>(values.size()));
  Put(out, values.data(), values.size());
  return out;
}

absl::StatusOr<std::vector<int32_t>> ParseValues(absl::Span<const uint8_t> bytes,
                                                 const std::string& source) {
  Reader reader(bytes, source);
  RETURN_IF_ERROR(reader.Magic(kValuesMagic));
  int64_t count = 0;
  RETURN_IF_ERROR(reader.Get(&count, 1));
  if (count < 0) return absl::DataLossError(absl::StrCat(source, ": negative count"));
  RETURN_IF_ERROR(reader.Expect(static_cast<uint64_t>(count) * sizeof(int32_t)));
  std::vector<int32_t> values(static_cast<size_t>(count));
  RETURN_IF_ERROR(reader.Get(values.data(), values.size()));
  RETURN_IF_ERROR(reader.AtEnd());
  return values;
}

std::string SerializeSubsetCodes(const SubsetCodes& codes) {
  std::string out(kCodesMagic, kMagicSize);
  Put<int32_t>(out, codes.m);
  Put<int32_t>(out, 0);
  Put<int64_t>(out, codes.num_sentences());
  Put<int64_t>(out, codes.num_vectors());
  Put(out, codes.offsets.data(), codes.offsets.size());
  Put(out, codes.codes.data(), codes.codes.size());
  return out;
}

absl::StatusOr<SubsetCodes> ParseSubsetCodes(absl::Span<const uint8_t> bytes,
                                             const std::string& source) {
  Reader reader(bytes, source);
  SubsetCodes codes;
  int32_t reserved = 0;
  int64_t num_sentences = 0;
  int64_t num_vectors = 0;
  RETURN_IF_ERROR(reader.Magic(kCodesMagic));
  RETURN_IF_ERROR(reader.Get(&codes.m, 1));
  RETURN_IF_ERROR(reader.Get(&reserved, 1));
  RETURN_IF_ERROR(reader.Get(&num_sentences, 1));
  RETURN_IF_ERROR(reader.Get(&num_vectors, 1));
  if (codes.m <= 0 || num_sentences < 0 || num_vectors < 0) {
    return absl::DataLossError(absl::StrCat(source, ": bad header (m ", codes.m, ", sentences ",
                                            num_sentences, ", vectors ", num_vectors, ")"));
  }
  if (num_sentences > int64_t{1} << 40 || num_vectors > int64_t{1} << 40) {
    return absl::DataLossError(absl::StrCat(source, ": implausible header"));
  }
  RETURN_IF_ERROR(reader.Expect((static_cast<uint64_t>(num_sentences) + 1) * sizeof(int64_t) +
                                static_cast<uint64_t>(num_vectors) * codes.m));
  codes.offsets.resize(static_cast<size_t>(num_sentences) + 1);
  RETURN_IF_ERROR(reader.Get(codes.offsets.data(), codes.offsets.size()));
  if (codes.offsets.back() != num_vectors) {
    return absl::DataLossError(absl::StrCat(source, ": offsets end at ", codes.offsets.back(),
                                            ", header says ", num_vectors, " vectors"));
  }
  codes.codes.resize(static_cast<size_t>(num_vectors) * codes.m);
  RETURN_IF_ERROR(reader.Get(codes.codes.data(), codes.codes.size()));
  RETURN_IF_ERROR(reader.AtEnd());
  return codes;
}

}  // namespace knnserve
