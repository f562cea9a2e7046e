#include "common/request.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire.h"

namespace knnserve {
namespace {

constexpr int64_t kEnvelopeBytes = 64 << 10;

absl::Status ValidateQueryShape(const v1::Matrix& queries, const IndexShape& shape,
                                const RequestLimits& limits) {
  if (queries.cols() != shape.dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "queries: ", queries.cols(), " columns, but the index dimension is ", shape.dim));
  }
  if (queries.rows() < 1 || queries.rows() > limits.max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("queries: ", queries.rows(), " rows; must be 1..", limits.max_rows));
  }
  return absl::OkStatus();
}

absl::Status ValidateRowGroups(absl::Span<const int32_t> row_group, int64_t rows,
                               size_t num_groups) {
  if (static_cast<int64_t>(row_group.size()) != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_group: ", row_group.size(), " entries for ", rows, " query rows"));
  }
  for (size_t i = 0; i < row_group.size(); ++i) {
    if (row_group[i] < 0 || static_cast<size_t>(row_group[i]) >= num_groups) {
      return absl::InvalidArgumentError(absl::StrCat(
          "row_group[", i, "] = ", row_group[i], " is not a group index in [0, ", num_groups, ")"));
    }
  }
  return absl::OkStatus();
}

// IEEE values without their sign bit compare as their magnitudes do, NaN and Inf above every
// finite one: the largest accepted magnitude's bits, and the mask that drops the sign.
constexpr uint32_t kFp32MaxBits = std::bit_cast<uint32_t>(kMaxQueryMagnitude);
constexpr uint32_t kFp32Magnitude = 0x7fffffffu;
constexpr uint16_t kFp16MaxBits = 0x7bffu;  // 65504, the largest finite half
constexpr uint16_t kFp16Magnitude = 0x7fffu;

// Whether every one of the `n` floating-point values at `bytes` (`Bits` wide, not necessarily
// aligned) is finite and at most `max_bits` in magnitude, read from their bits without a branch
// per element, so that the scan vectorizes.
template <typename Bits>
bool AllWithin(const char* bytes, int64_t n, Bits magnitude, Bits max_bits) {
  uint32_t outside = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, bytes + i * sizeof(bits), sizeof(bits));
    outside |= static_cast<uint32_t>((bits & magnitude) > max_bits);
  }
  return outside == 0;
}

}  // namespace

int64_t RequestLimits::MaxMessageBytes(int dim) const {
  const int64_t query_bytes = int64_t{max_rows} * dim * 4;
  const int64_t subset_bytes = max_total_subset_sentences * 10;  // varints of at most 10 bytes
  // Per neighbour: a float distance, an int64 id and an int32 value, each varint up to 10 bytes
  // (a missing neighbour's −1 takes all 10: proto3 sign-extends negative int32s).
  const int64_t result_bytes = int64_t{max_rows} * max_k * (4 + 10 + 10);
  return std::max(query_bytes + subset_bytes, result_bytes) + kEnvelopeBytes;
}

void RequestLimits::ToProto(int dim, v1::Limits* limits) const {
  limits->set_max_k(max_k);
  limits->set_max_rows(max_rows);
  limits->set_max_subset_sentences(max_subset_sentences);
  limits->set_max_total_subset_sentences(max_total_subset_sentences);
  limits->set_max_message_bytes(MaxMessageBytes(dim));
  limits->set_max_ef_search(max_ef_search);
  limits->set_max_nprobe(max_nprobe);
}

void NarrowLimits(const v1::Limits& other, v1::Limits* limits) {
  const auto narrow = [](auto theirs, auto ours) {
    if (theirs <= 0) return ours;
    return ours <= 0 ? theirs : std::min(ours, theirs);
  };
  limits->set_max_k(narrow(other.max_k(), limits->max_k()));
  limits->set_max_rows(narrow(other.max_rows(), limits->max_rows()));
  limits->set_max_subset_sentences(
      narrow(other.max_subset_sentences(), limits->max_subset_sentences()));
  limits->set_max_total_subset_sentences(
      narrow(other.max_total_subset_sentences(), limits->max_total_subset_sentences()));
  limits->set_max_message_bytes(narrow(other.max_message_bytes(), limits->max_message_bytes()));
  limits->set_max_ef_search(narrow(other.max_ef_search(), limits->max_ef_search()));
  limits->set_max_nprobe(narrow(other.max_nprobe(), limits->max_nprobe()));
}

absl::Status ValidateParams(const v1::SearchParams& params, const RequestLimits& limits) {
  if (params.k() < 1 || params.k() > limits.max_k) {
    return absl::InvalidArgumentError(
        absl::StrCat("params.k = ", params.k(), "; must be 1..", limits.max_k));
  }
  if (params.nprobe() < 0 || params.nprobe() > limits.max_nprobe) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params.nprobe = ", params.nprobe(), "; must be 0..", limits.max_nprobe, " (0 = default)"));
  }
  if (params.ef_search() < 0 || params.ef_search() > limits.max_ef_search) {
    return absl::InvalidArgumentError(absl::StrCat("params.ef_search = ", params.ef_search(),
                                                   "; must be 0..", limits.max_ef_search,
                                                   " (0 = default)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SubsetGroups> ParseSubsetGroups(
    const google::protobuf::RepeatedPtrField<v1::SubsetGroup>& groups, const IndexShape& shape,
    const RequestLimits& limits) {
  if (!groups.empty() && shape.num_sentences == 0) {
    return absl::FailedPreconditionError(
        "subset search requested, but this index holds no subset codes");
  }
  if (groups.size() > limits.max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("subset_groups: ", groups.size(), " groups; at most ", limits.max_rows));
  }
  int64_t total = 0;
  for (const v1::SubsetGroup& group : groups) total += group.sentence_ids_size();
  if (total > limits.max_total_subset_sentences) {
    return absl::InvalidArgumentError(
        absl::StrCat("subset_groups: ", total, " sentence ids in all; at most ",
                     limits.max_total_subset_sentences, " per request"));
  }
  SubsetGroups parsed;
  parsed.reserve(groups.size());
  for (int g = 0; g < groups.size(); ++g) {
    const auto& ids = groups[g].sentence_ids();
    if (ids.empty() || ids.size() > limits.max_subset_sentences) {
      return absl::InvalidArgumentError(absl::StrCat("subset_groups[", g, "]: ", ids.size(),
                                                     " sentences; must be 1..",
                                                     limits.max_subset_sentences));
    }
    for (int i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= shape.num_sentences) {
        return absl::InvalidArgumentError(
            absl::StrCat("subset_groups[", g, "].sentence_ids[", i, "] = ", ids[i],
                         " is not a sentence id in [0, ", shape.num_sentences, ")"));
      }
    }
    // Kept sorted (a group is a set): duplicates are then neighbours, and the engines, which
    // scan a group's sentences in storage order, find them sorted at every step.
    std::vector<int64_t>& group = parsed.emplace_back(ids.begin(), ids.end());
    std::sort(group.begin(), group.end());
    if (const auto dup = std::adjacent_find(group.begin(), group.end()); dup != group.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("subset_groups[", g, "]: sentence id ", *dup, " appears more than once"));
    }
  }
  return parsed;
}

absl::Status CheckQueryValues(const Matrix<float>& m, absl::string_view what) {
  if (AllWithin(reinterpret_cast<const char*>(m.data()), m.size(), kFp32Magnitude, kFp32MaxBits)) {
    return absl::OkStatus();
  }
  const float* data = m.data();
  for (int64_t i = 0; i < m.size(); ++i) {
    if (!(std::abs(data[i]) <= kMaxQueryMagnitude)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i / m.cols(), "][", i % m.cols(), "] is ", data[i],
                       "; queries must be finite and within +-2^50 (1.1e15)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckQueryValues(const v1::Matrix& packed, absl::string_view what) {
  const std::string& data = packed.data();
  const bool within = packed.dtype() == v1::DTYPE_FP16
                          ? AllWithin(data.data(), data.size() / 2, kFp16Magnitude, kFp16MaxBits)
                          : AllWithin(data.data(), data.size() / 4, kFp32Magnitude, kFp32MaxBits);
  if (within) return absl::OkStatus();
  // Rare: decode for the message that names the first value out of range.
  ASSIGN_OR_RETURN(Matrix<float> decoded, DecodeMatrix(packed, what));
  return CheckQueryValues(decoded, what);
}

bool IsUnknownSubsetSession(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         absl::StartsWith(status.message(), kUnknownSubsetSession);
}

absl::StatusOr<SearchQuery> ParseSearchRequest(const v1::SearchRequest& request,
                                               const IndexShape& shape, const RequestLimits& limits,
                                               const SubsetSource& subsets, QueryForm form) {
  if (!request.has_queries()) return absl::InvalidArgumentError("queries: missing");
  RETURN_IF_ERROR(ValidateQueryShape(request.queries(), shape, limits));
  RETURN_IF_ERROR(ValidateParams(request.params(), limits));
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id: ", request.request_id().size(),
                                                   " bytes; at most ", kMaxRequestIdBytes));
  }
  if (request.subset_session().size() > kMaxSubsetSessionBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("subset_session: ", request.subset_session().size(), " bytes; at most ",
                     kMaxSubsetSessionBytes));
  }
  SearchQuery query;
  if (form == QueryForm::kPacked) {
    RETURN_IF_ERROR(ValidateMatrix(request.queries(), "queries"));
    RETURN_IF_ERROR(CheckQueryValues(request.queries(), "queries"));
    query.packed_queries = request.queries();
  } else {
    ASSIGN_OR_RETURN(query.queries, DecodeMatrix(request.queries(), "queries"));
    RETURN_IF_ERROR(CheckQueryValues(query.queries, "queries"));
  }
  query.queries_dtype = request.queries().dtype();
  query.params.k = request.params().k();
  query.params.nprobe = request.params().nprobe();
  query.params.ef_search = request.params().ef_search();

  query.subset_session = request.subset_session();
  if (request.subset_groups_size() > 0) {
    ASSIGN_OR_RETURN(SubsetGroups groups,
                     ParseSubsetGroups(request.subset_groups(), shape, limits));
    query.subset_groups = ShareGroups(std::move(groups));
    query.declares_groups = true;
  } else if (!query.subset_session.empty()) {
    if (subsets.sessions != nullptr) {
      SubsetSessions::Kept kept = subsets.sessions->Get(query.subset_session);
      query.subset_groups = std::move(kept.groups);
      query.subset_session = std::move(kept.forward_token);
    }
    if (query.subset_groups == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(kUnknownSubsetSession,
                       ": this server holds no groups for it (never sent, forgotten or "
                       "restarted); send the request again with its subset_groups"));
    }
  } else if (subsets.stream_groups != nullptr) {
    query.subset_groups = subsets.stream_groups;
    query.subset_session = subsets.stream_session;
  }
  if (query.is_subset()) {
    query.row_group.assign(request.row_group().begin(), request.row_group().end());
    RETURN_IF_ERROR(ValidateRowGroups(query.row_group, query.rows(), query.subset_groups->size()));
  } else if (request.row_group_size() > 0) {
    return absl::InvalidArgumentError("row_group given without subset_groups");
  }
  query.allow_partial = request.allow_partial();
  query.request_id = request.request_id();
  if (subsets.sessions != nullptr && request.subset_groups_size() > 0 &&
      !query.subset_session.empty()) {
    query.subset_session = subsets.sessions->Put(query.subset_session, query.subset_groups);
  }
  return query;
}

}  // namespace knnserve
