// Validation at the edge: turns a v1::SearchRequest into a SearchQuery, or INVALID_ARGUMENT
// with a message that names what was wrong. Shards and routers both call it before any work.
#ifndef KNNSERVE_COMMON_REQUEST_H_
#define KNNSERVE_COMMON_REQUEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/matrix.h"
#include "common/search_types.h"
#include "common/subset_sessions.h"
#include "knnserve/v1/retrieval.pb.h"

namespace knnserve {

// What a server accepts. Defaults are the protocol's documented defaults.
struct RequestLimits {
  int max_k = 1024;
  int max_rows = 4096;
  // HNSW's candidate list per query (faiss allocates it per search, in each OpenMP thread,
  // where an allocation failure cannot be caught).
  int max_ef_search = 16384;
  // IVF lists probed per query row: the index clamps nprobe to its lists, but a request that
  // probes them all scans the whole shard for each of its rows, and no engine call can be
  // stopped once it runs (4,096 rows x a 100M-vector shard would hold a core for hours).
  int max_nprobe = 4096;
  int max_subset_sentences = 65536;              // per group
  int64_t max_total_subset_sentences = 1 << 20;  // over all groups of one request

  // The largest request or response message for index dimension `dim`: a full fp32 query
  // matrix plus max_total_subset_sentences ids, or a full result of missing neighbours (the
  // largest on the wire), plus 64 KiB for the envelope (with the defaults about 101 MB, the
  // result's share). Servers pass it to gRPC as the max message size.
  int64_t MaxMessageBytes(int dim) const;
  void ToProto(int dim, v1::Limits* limits) const;
};

// Field by field, the smaller of *limits and `other` (0: unset, the other wins): what a router
// can take is what it and every shard behind it take.
void NarrowLimits(const v1::Limits& other, v1::Limits* limits);

// The shape of what is being searched, as far as validation needs it.
struct IndexShape {
  int dim = 0;
  int64_t num_sentences = 0;  // 0 when the index holds no subset codes
};

// How ParseSearchRequest hands over the queries: decoded to fp32 (what engines search), or
// packed as they arrived (what a router forwards to its shards unchanged).
enum class QueryForm { kDecoded, kPacked };

// A validated request.
struct SearchQuery {
  Matrix<float> queries;  // rows x dim, finite; empty when the queries are packed
  // kPacked: the request's queries, validated (shape, byte length, finite values) but not
  // decoded, and `queries` empty. Unset for kDecoded.
  std::optional<v1::Matrix> packed_queries;
  SearchParams params;
  // Subset search when set: row_group[i] (queries.rows() entries) indexes *subset_groups.
  // Shared so that the steps of a stream reuse the session's groups without copying them.
  std::shared_ptr<const SubsetGroups> subset_groups;
  std::vector<int32_t> row_group;
  bool allow_partial = false;
  std::string request_id;
  // The token a router names subset_groups with to its shards: the one SubsetSessions minted
  // when it kept them under the request's SearchRequest.subset_session, the one the request's
  // stream chose at setup, or, without a SubsetSource::sessions, the request's own. Empty when
  // none.
  std::string subset_session;
  // Whether subset_groups came with the request itself (else they were kept under the token or
  // declared by the stream): a router then passes them on with the token, as no shard knows a
  // token just minted.
  bool declares_groups = false;
  // The element type the queries arrived in. A router forwards them in it: packed as they came,
  // or, decoded, re-encoded (fp16 decoded to fp32 encodes back to the same fp16 values).
  v1::DType queries_dtype = v1::DTYPE_FP32;

  bool is_subset() const { return subset_groups != nullptr; }
  int64_t rows() const {
    return packed_queries.has_value() ? packed_queries->rows() : queries.rows();
  }
};

// The size of the answer to `query`, an estimate: rows x k neighbours of a float distance, an
// int64 id and an int32 value each, as decoded (the encoded message is of the same order).
inline int64_t AnswerBytes(const SearchQuery& query) {
  return query.rows() * query.params.k *
         static_cast<int64_t>(sizeof(float) + sizeof(int64_t) + sizeof(int32_t));
}

// Where a request without subset groups of its own finds them.
struct SubsetSource {
  // The groups a stream's setup message declared (null when none), and the token the stream
  // names them with.
  std::shared_ptr<const SubsetGroups> stream_groups;
  std::string stream_session;
  // Groups kept under subset_session tokens: a request with a token and groups adds them, a
  // request with a token alone takes them. Null: every token is unknown.
  SubsetSessions* sessions = nullptr;
};

// The message (prefix) of the FAILED_PRECONDITION a request naming a subset_session without
// groups gets when `SubsetSource::sessions` holds none under its token. The caller sends the
// request again with its groups.
inline constexpr absl::string_view kUnknownSubsetSession = "unknown subset_session";
bool IsUnknownSubsetSession(const absl::Status& status);

// The message (prefix) of the UNAVAILABLE a shard answers when its queue is full; a router
// reports such a shard's gap as DEGRADED_REASON_OVERLOADED.
inline constexpr absl::string_view kShardOverloaded = "shard overloaded";

// The longest subset_session token accepted.
inline constexpr size_t kMaxSubsetSessionBytes = 64;
// The longest request_id accepted (it is forwarded to every shard and echoed in the answer).
inline constexpr size_t kMaxRequestIdBytes = 256;

// Validates and decodes `request` (its queries to fp32, or copied packed: see QueryForm). A
// request without subset groups of its own searches those kept under its subset_session token,
// or else the stream's (see SubsetSource); groups that come with a token are kept under it
// once the request is valid. Both forms accept and refuse the same requests, with the same
// messages.
absl::StatusOr<SearchQuery> ParseSearchRequest(const v1::SearchRequest& request,
                                               const IndexShape& shape, const RequestLimits& limits,
                                               const SubsetSource& subsets = {},
                                               QueryForm form = QueryForm::kDecoded);

// The pieces ParseSearchRequest is made of, for stream setup messages.
absl::Status ValidateParams(const v1::SearchParams& params, const RequestLimits& limits);
// Each returned group is sorted (a group is a set of sentences; duplicates are refused).
absl::StatusOr<SubsetGroups> ParseSubsetGroups(
    const google::protobuf::RepeatedPtrField<v1::SubsetGroup>& groups, const IndexShape& shape,
    const RequestLimits& limits);
// The largest query value accepted, in magnitude: squared distances of such queries stay far
// from float overflow (beyond it, inf − inf made every distance NaN, or 0).
inline constexpr float kMaxQueryMagnitude = 0x1p50f;
// INVALID_ARGUMENT naming the first NaN, Inf or value beyond kMaxQueryMagnitude (row and
// column).
absl::Status CheckQueryValues(const Matrix<float>& m, absl::string_view what);
// The same for a packed matrix that ValidateMatrix (wire.h) accepted, without decoding it
// unless it holds such a value: the same status, message included, as on the decoded matrix.
absl::Status CheckQueryValues(const v1::Matrix& packed, absl::string_view what);

}  // namespace knnserve

#endif  // KNNSERVE_COMMON_REQUEST_H_
