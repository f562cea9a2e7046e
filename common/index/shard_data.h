// The non-faiss files of a shard: its values (one int32 target token per vector) and its
// subset PQ codes grouped by sentence. Little-endian binary, self-describing:
//
//   values:        "KNSVALS1" int64 count, int32 values[count]
//   subset codes:  "KNSCODE1" int32 m, int32 0, int64 num_sentences, int64 num_vectors,
//                  int64 offsets[num_sentences + 1] (local, offsets[0] == 0),
//                  uint8 codes[num_vectors * m]
#ifndef KNNSERVE_COMMON_INDEX_SHARD_DATA_H_
#define KNNSERVE_COMMON_INDEX_SHARD_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/adc/subset_adc.h"
#include "common/files.h"

namespace knnserve {

std::string SerializeValues(absl::Span<const int32_t> values);
// The bytes before the values of a values file of `count` values: a file written in chunks is
// ValuesHeader(count) followed by the count int32s, byte for byte SerializeValues.
std::string ValuesHeader(int64_t count);
// Reads a values file to its end; DATA_LOSS naming `in` when it is not one.
absl::StatusOr<std::vector<int32_t>> ReadValues(ByteReader& in);

// Serializes codes.m, codes.offsets and codes.codes (the global bases live in the manifest).
std::string SerializeSubsetCodes(const SubsetCodes& codes);
// The bytes before the codes of a subset codes file with these offsets (REQUIRES: not empty): a
// file written in chunks is this header followed by the offsets.back() x m code bytes, byte for
// byte SerializeSubsetCodes.
std::string SubsetCodesHeader(int m, absl::Span<const int64_t> offsets);
// Reads a subset codes file to its end into a SubsetCodes with sentence_begin and token_begin
// left at 0; DATA_LOSS naming `in` when it is not one. Nothing is allocated for the codes
// before the header is checked against the bytes left.
absl::StatusOr<SubsetCodes> ReadSubsetCodes(ByteReader& in);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_INDEX_SHARD_DATA_H_
