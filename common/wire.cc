#include "common/wire.h"

#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/half.h"
#include "common/status_macros.h"

namespace knnserve {

int DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return 4;
    case v1::DTYPE_FP16:
      return 2;
    default:
      return 0;
  }
}

absl::Status ValidateMatrix(const v1::Matrix& packed, absl::string_view what) {
  const int element_size = DTypeSize(packed.dtype());
  if (element_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": dtype ", v1::DType_Name(packed.dtype()), " (", static_cast<int>(packed.dtype()),
        ") is not supported; use DTYPE_FP32 or DTYPE_FP16"));
  }
  const int64_t rows = packed.rows();
  const int64_t cols = packed.cols();
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": negative shape ", rows, " x ", cols));
  }
  // Guard the multiplication before trusting it: a hostile rows * cols could overflow.
  const int64_t max_elements = std::numeric_limits<int64_t>::max() / 8;
  if (cols != 0 && rows > max_elements / cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape ", rows, " x ", cols, " is too large"));
  }
  const int64_t count = rows * cols;
  const int64_t expected_bytes = count * element_size;
  if (static_cast<int64_t>(packed.data().size()) != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": data holds ", packed.data().size(), " bytes but ", rows, " x ", cols,
                     " ", v1::DType_Name(packed.dtype()), " needs ", expected_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<Matrix<float>> DecodeMatrix(const v1::Matrix& packed, absl::string_view what) {
  RETURN_IF_ERROR(ValidateMatrix(packed, what));
  const int64_t count = packed.rows() * packed.cols();
  const int64_t expected_bytes = count * DTypeSize(packed.dtype());
  std::vector<float> values(count);
  if (packed.dtype() == v1::DTYPE_FP32) {
    std::memcpy(values.data(), packed.data().data(), expected_bytes);
  } else {
    std::vector<uint16_t> halves(count);
    std::memcpy(halves.data(), packed.data().data(), expected_bytes);
    HalvesToFloats(halves.data(), count, values.data());
  }
  return Matrix<float>(packed.rows(), packed.cols(), std::move(values));
}

void EncodeMatrix(MatrixView<const float> m, v1::DType dtype, v1::Matrix* packed) {
  KNNSERVE_CHECK(dtype == v1::DTYPE_FP32 || dtype == v1::DTYPE_FP16, "EncodeMatrix dtype");
  packed->set_rows(m.rows);
  packed->set_cols(m.cols);
  packed->set_dtype(dtype);
  std::string* data = packed->mutable_data();
  if (dtype == v1::DTYPE_FP32) {
    data->assign(reinterpret_cast<const char*>(m.data), m.size() * sizeof(float));
  } else {
    std::vector<uint16_t> halves(m.size());
    FloatsToHalves(m.data, m.size(), halves.data());
    data->assign(reinterpret_cast<const char*>(halves.data()), m.size() * sizeof(uint16_t));
  }
}

void EncodeParams(const SearchParams& params, v1::SearchParams* packed) {
  packed->set_k(params.k);
  packed->set_nprobe(params.nprobe);
  packed->set_ef_search(params.ef_search);
}

void EncodeSearchRequest(MatrixView<const float> queries, v1::DType dtype,
                         const SearchParams& params, v1::SearchRequest* request) {
  EncodeMatrix(queries, dtype, request->mutable_queries());
  EncodeParams(params, request->mutable_params());
}

void EncodeNeighbors(const Neighbors& neighbors, v1::SearchResponse* response) {
  response->set_rows(neighbors.rows);
  response->set_k(neighbors.k);
  response->mutable_distances()->Assign(neighbors.distances.begin(), neighbors.distances.end());
  response->mutable_ids()->Assign(neighbors.ids.begin(), neighbors.ids.end());
  response->mutable_values()->Assign(neighbors.values.begin(), neighbors.values.end());
}

absl::StatusOr<Neighbors> DecodeNeighbors(const v1::SearchResponse& response) {
  const int64_t size = response.rows() * response.k();
  if (response.rows() < 0 || response.k() < 0 || response.distances_size() != size ||
      response.ids_size() != size ||
      (response.values_size() != 0 && response.values_size() != size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("response: ", response.distances_size(), " distances, ", response.ids_size(),
                     " ids and ", response.values_size(),
                     " values do not match rows x k = ", response.rows(), " x ", response.k()));
  }
  Neighbors n;
  n.rows = response.rows();
  n.k = response.k();
  n.distances.assign(response.distances().begin(), response.distances().end());
  n.ids.assign(response.ids().begin(), response.ids().end());
  n.values.assign(response.values().begin(), response.values().end());
  return n;
}

v1::Metric MetricToProto(Metric metric) {
  return metric == Metric::kL2 ? v1::METRIC_L2 : v1::METRIC_INNER_PRODUCT;
}

absl::StatusOr<Metric> MetricFromProto(v1::Metric metric) {
  switch (metric) {
    case v1::METRIC_L2:
      return Metric::kL2;
    case v1::METRIC_INNER_PRODUCT:
      return Metric::kInnerProduct;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", v1::Metric_Name(metric), " is not supported"));
  }
}

}  // namespace knnserve
