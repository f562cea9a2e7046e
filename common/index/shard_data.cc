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
  explicit Reader(ByteReader& in) : in_(in) {}

  absl::Status Magic(const char* magic) {
    const absl::Status not_magic =
        absl::DataLossError(absl::StrCat(in_.name(), ": not a ", magic, " file"));
    if (in_.remaining() < kMagicSize) return not_magic;
    char read[kMagicSize];
    RETURN_IF_ERROR(Get(read, kMagicSize));  // a read error is reported as itself
    return std::memcmp(read, magic, kMagicSize) == 0 ? absl::OkStatus() : not_magic;
  }
  template <typename T>
  absl::Status Get(T* out, size_t count) {
    const size_t size = count * sizeof(T);
    if (count > in_.remaining() || in_.remaining() < size) {
      return absl::DataLossError(absl::StrCat(in_.name(), ": truncated at byte ", position_));
    }
    ASSIGN_OR_RETURN(const size_t n, in_.Read(out, size));
    position_ += n;
    return absl::OkStatus();
  }
  // DATA_LOSS unless exactly `expected` bytes are left (checked before allocating for them).
  absl::Status Expect(uint64_t expected) const {
    if (expected != in_.remaining()) {
      return absl::DataLossError(absl::StrCat(in_.name(), ": header promises ", expected,
                                              " more bytes, the file has ", in_.remaining()));
    }
    return absl::OkStatus();
  }
  absl::Status AtEnd() const {
    if (in_.remaining() != 0) {
      return absl::DataLossError(
          absl::StrCat(in_.name(), ": ", in_.remaining(), " unexpected trailing bytes"));
    }
    return absl::OkStatus();
  }

 private:
  ByteReader& in_;
  uint64_t position_ = 0;
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

absl::StatusOr<std::vector<int32_t>> ReadValues(ByteReader& in) {
  Reader reader(in);
  RETURN_IF_ERROR(reader.Magic(kValuesMagic));
  int64_t count = 0;
  RETURN_IF_ERROR(reader.Get(&count, 1));
  if (count < 0) return absl::DataLossError(absl::StrCat(in.name(), ": negative count"));
  RETURN_IF_ERROR(reader.Expect(static_cast<uint64_t>(count) * sizeof(int32_t)));
  std::vector<int32_t> values(static_cast<size_t>(count));
  RETURN_IF_ERROR(reader.Get(values.data(), values.size()));
  RETURN_IF_ERROR(reader.AtEnd());
  return values;
}

std::string SubsetCodesHeader(int m, absl::Span<const int64_t> offsets) {
  std::string out(kCodesMagic, kMagicSize);
  Put<int32_t>(out, m);
  Put<int32_t>(out, 0);
  Put<int64_t>(out, static_cast<int64_t>(offsets.size()) - 1);
  Put<int64_t>(out, offsets.back());
  Put(out, offsets.data(), offsets.size());
  return out;
}

std::string SerializeSubsetCodes(const SubsetCodes& codes) {
  std::string out = SubsetCodesHeader(codes.m, codes.offsets);
  Put(out, codes.codes.data(), codes.codes.size());
  return out;
}

absl::StatusOr<SubsetCodes> ReadSubsetCodes(ByteReader& in) {
  const std::string& source = in.name();
  Reader reader(in);
  SubsetCodes codes;
  int32_t reserved = 0;
  int64_t num_sentences = 0;
  int64_t num_vectors = 0;
  RETURN_IF_ERROR(reader.Magic(kCodesMagic));
  RETURN_IF_ERROR(reader.Get(&codes.m, 1));
  RETURN_IF_ERROR(reader.Get(&reserved, 1));
  RETURN_IF_ERROR(reader.Get(&num_sentences, 1));
  RETURN_IF_ERROR(reader.Get(&num_vectors, 1));
  // m bounded as the scans bound it, so that the size check below cannot overflow.
  if (codes.m <= 0 || codes.m > kMaxAdcM || num_sentences < 0 || num_vectors < 0) {
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
