// Codec between the v1 protocol messages and knnserve's types: packed matrices (fp32/fp16,
// little-endian) and neighbour lists.
#ifndef KNNSERVE_COMMON_WIRE_H_
#define KNNSERVE_COMMON_WIRE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/matrix.h"
#include "common/search_types.h"
#include "knnserve/v1/retrieval.pb.h"

namespace knnserve {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian; big-endian hosts are not supported");

// Bytes per element of `dtype`; 0 for DTYPE_UNSPECIFIED and unknown values.
int DTypeSize(v1::DType dtype);

// Checks that a packed matrix can be decoded. `what` names the field in error messages
// ("queries"). INVALID_ARGUMENT for an unknown dtype, negative shape, or data whose byte length
// is not rows * cols * DTypeSize(dtype). Values are not checked for NaN/Inf here (see
// request.h).
absl::Status ValidateMatrix(const v1::Matrix& packed, absl::string_view what);

// Decodes a packed matrix to fp32; fails as ValidateMatrix does.
absl::StatusOr<Matrix<float>> DecodeMatrix(const v1::Matrix& packed, absl::string_view what);

// Packs `m` as `dtype` (fp16 rounds to nearest even). REQUIRES: dtype is FP32 or FP16.
void EncodeMatrix(MatrixView<const float> m, v1::DType dtype, v1::Matrix* packed);

// Sets `packed`'s k, nprobe and ef_search from `params`: what ParseSearchRequest reads back.
void EncodeParams(const SearchParams& params, v1::SearchParams* packed);

// Fills `request`'s queries (`queries` packed as `dtype`, see EncodeMatrix) and params; leaves
// row groups, subset, request id and allow_partial alone.
void EncodeSearchRequest(MatrixView<const float> queries, v1::DType dtype,
                         const SearchParams& params, v1::SearchRequest* request);

// Fills the result fields of `response` (rows, k, distances, ids, values); leaves coverage,
// request_id and error fields alone.
void EncodeNeighbors(const Neighbors& neighbors, v1::SearchResponse* response);

// Reads the result fields back; INVALID_ARGUMENT when array lengths disagree with rows x k.
absl::StatusOr<Neighbors> DecodeNeighbors(const v1::SearchResponse& response);

v1::Metric MetricToProto(Metric metric);
absl::StatusOr<Metric> MetricFromProto(v1::Metric metric);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_WIRE_H_
