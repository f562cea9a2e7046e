#include "common/request.h"

#include <cmath>
#include <functional>
#include <string>

#include "common/status_matchers.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve {
namespace {

using ::knnserve::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kDim = 8;
const IndexShape kShape{kDim, /*num_sentences=*/100};
const RequestLimits kLimits;

template <typename Field>
void AddAll(Field* field, std::initializer_list<typename Field::value_type> values) {
  for (auto v : values) field->Add(v);
}

v1::SearchRequest ValidRequest(int rows = 3) {
  v1::SearchRequest request;
  Matrix<float> queries(rows, kDim);
  for (int64_t i = 0; i < queries.size(); ++i) queries.data()[i] = 0.25f * i;
  EncodeMatrix(queries.view(), v1::DTYPE_FP32, request.mutable_queries());
  request.mutable_params()->set_k(16);
  return request;
}

v1::SearchRequest ValidSubsetRequest() {
  v1::SearchRequest request = ValidRequest(3);
  AddAll(request.add_subset_groups()->mutable_sentence_ids(), {1, 5, 99});
  AddAll(request.add_subset_groups()->mutable_sentence_ids(), {0});
  AddAll(request.mutable_row_group(), {0, 0, 1});
  return request;
}

TEST(ParseSearchRequest, AcceptsAFullSearch) {
  ASSERT_OK_AND_ASSIGN(SearchQuery query, ParseSearchRequest(ValidRequest(), kShape, kLimits));
  EXPECT_EQ(query.queries.rows(), 3);
  EXPECT_EQ(query.queries.cols(), kDim);
  EXPECT_EQ(query.queries.at(1, 0), 0.25f * kDim);
  EXPECT_EQ(query.params.k, 16);
  EXPECT_FALSE(query.is_subset());
}

TEST(ParseSearchRequest, ReadsBackWhatEncodeSearchRequestWrote) {
  Matrix<float> queries(2, kDim);
  for (int64_t i = 0; i < queries.size(); ++i) queries.data()[i] = 0.5f - 0.0625f * i;
  SearchParams params;
  params.k = 7;
  params.nprobe = 3;
  params.ef_search = 40;
  v1::SearchRequest request;
  EncodeSearchRequest(queries.view(), v1::DTYPE_FP32, params, &request);
  ASSERT_OK_AND_ASSIGN(SearchQuery query, ParseSearchRequest(request, kShape, kLimits));
  EXPECT_EQ(query.queries, queries);
  EXPECT_EQ(query.params.k, 7);
  EXPECT_EQ(query.params.nprobe, 3);
  EXPECT_EQ(query.params.ef_search, 40);
  EXPECT_FALSE(query.is_subset());
}

TEST(ParseSearchRequest, PackedFormKeepsTheQueriesAsTheyCame) {
  for (const v1::DType dtype : {v1::DTYPE_FP32, v1::DTYPE_FP16}) {
    v1::SearchRequest request = ValidSubsetRequest();
    Matrix<float> queries(3, kDim);
    for (int64_t i = 0; i < queries.size(); ++i) queries.data()[i] = -1.5f + 0.125f * i;
    EncodeMatrix(queries.view(), dtype, request.mutable_queries());
    ASSERT_OK_AND_ASSIGN(SearchQuery decoded, ParseSearchRequest(request, kShape, kLimits));
    ASSERT_OK_AND_ASSIGN(SearchQuery packed,
                         ParseSearchRequest(request, kShape, kLimits, {}, QueryForm::kPacked));
    ASSERT_TRUE(packed.packed_queries.has_value());
    EXPECT_EQ(packed.packed_queries->SerializeAsString(), request.queries().SerializeAsString());
    EXPECT_EQ(packed.queries.size(), 0);
    EXPECT_EQ(packed.rows(), 3);
    EXPECT_FALSE(decoded.packed_queries.has_value());
    EXPECT_EQ(decoded.rows(), 3);
    EXPECT_EQ(packed.queries_dtype, dtype);
    EXPECT_EQ(*packed.subset_groups, *decoded.subset_groups);
    EXPECT_EQ(packed.row_group, decoded.row_group);
    EXPECT_EQ(packed.params.k, decoded.params.k);
  }
}

// The packed check reads the bits; it must agree with the decoded values' magnitudes.
TEST(CheckQueryValues, PackedAgreesWithTheDecodedCheckOnEveryHalf) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    v1::Matrix packed;
    packed.set_rows(1);
    packed.set_cols(2);
    packed.set_dtype(v1::DTYPE_FP16);
    const uint16_t halves[2] = {0x3c00, static_cast<uint16_t>(bits)};  // 1.0, then `bits`
    packed.set_data(reinterpret_cast<const char*>(halves), sizeof(halves));
    ASSERT_OK_AND_ASSIGN(Matrix<float> decoded, DecodeMatrix(packed, "queries"));
    ASSERT_EQ(CheckQueryValues(packed, "queries"), CheckQueryValues(decoded, "queries")) << bits;
    ASSERT_EQ(CheckQueryValues(decoded, "queries").ok(), std::isfinite(decoded.at(0, 1))) << bits;
  }
}

TEST(CheckQueryValues, PackedAgreesWithTheDecodedCheckOnSpecialFloats) {
  const float specials[] = {0.0f,          -0.0f,           1e-45f,
                            -1e-45f,       1e-38f,          3.4e38f,
                            -3.4e38f,      INFINITY,        -INFINITY,
                            std::nanf(""), -std::nanf("1"), 1.0f,
                            0x1p50f,       -0x1p50f,        std::nextafter(0x1p50f, 1e38f),
                            -1.2e15f};
  for (const float special : specials) {
    for (int64_t at : {0, 5, 37}) {  // first, in a vector body, last
      Matrix<float> m(2, 19);
      m.data()[at] = special;
      v1::Matrix packed;
      EncodeMatrix(m.view(), v1::DTYPE_FP32, &packed);
      EXPECT_EQ(CheckQueryValues(packed, "queries"), CheckQueryValues(m, "queries"))
          << special << at;
      EXPECT_EQ(CheckQueryValues(m, "queries").ok(), std::abs(special) <= 0x1p50f) << special << at;
    }
  }
}

TEST(ParseSearchRequest, AcceptsASubsetSearch) {
  ASSERT_OK_AND_ASSIGN(SearchQuery query,
                       ParseSearchRequest(ValidSubsetRequest(), kShape, kLimits));
  ASSERT_TRUE(query.is_subset());
  EXPECT_EQ(*query.subset_groups, (SubsetGroups{{1, 5, 99}, {0}}));
  EXPECT_EQ(query.row_group, (std::vector<int32_t>{0, 0, 1}));
}

TEST(ParseSearchRequest, StreamStepsReuseTheSessionGroups) {
  auto session = std::make_shared<const SubsetGroups>(SubsetGroups{{3}, {4, 5}});
  v1::SearchRequest step = ValidRequest(2);
  AddAll(step.mutable_row_group(), {1, 0});
  ASSERT_OK_AND_ASSIGN(SearchQuery query, ParseSearchRequest(step, kShape, kLimits, {session}));
  EXPECT_EQ(query.subset_groups, session);  // shared, not copied
  EXPECT_EQ(query.row_group, (std::vector<int32_t>{1, 0}));
}

// Every malformed request is rejected with INVALID_ARGUMENT (or FAILED_PRECONDITION) and a
// message of its own that names the offending field.
struct BadCase {
  std::string name;
  std::function<void(v1::SearchRequest*)> corrupt;
  absl::StatusCode code;
  std::string message;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class ParseSearchRequestRejects : public ::testing::TestWithParam<BadCase> {};

TEST_P(ParseSearchRequestRejects, WithItsOwnMessage) {
  v1::SearchRequest request = ValidSubsetRequest();
  GetParam().corrupt(&request);
  IndexShape shape = kShape;
  if (GetParam().name == "SubsetWithoutCodes") shape.num_sentences = 0;
  const absl::StatusOr<SearchQuery> decoded = ParseSearchRequest(request, shape, kLimits);
  EXPECT_THAT(decoded, StatusIs(GetParam().code, HasSubstr(GetParam().message)));
  // A router (packed queries) refuses it with the very same status.
  EXPECT_EQ(ParseSearchRequest(request, shape, kLimits, {}, QueryForm::kPacked).status(),
            decoded.status());
}

const auto kInvalid = absl::StatusCode::kInvalidArgument;

INSTANTIATE_TEST_SUITE_P(
    BadRequests, ParseSearchRequestRejects,
    ::testing::Values(
        BadCase{"MissingQueries", [](auto* r) { r->clear_queries(); }, kInvalid,
                "queries: missing"},
        BadCase{"WrongDimension",
                [](auto* r) {
                  Matrix<float> m(3, kDim + 1);
                  EncodeMatrix(m.view(), v1::DTYPE_FP32, r->mutable_queries());
                },
                kInvalid, "9 columns, but the index dimension is 8"},
        BadCase{"ZeroRows",
                [](auto* r) {
                  r->mutable_queries()->set_rows(0);
                  r->mutable_queries()->clear_data();
                },
                kInvalid, "queries: 0 rows; must be 1..4096"},
        BadCase{"TooManyRows", [](auto* r) { r->mutable_queries()->set_rows(5000); }, kInvalid,
                "queries: 5000 rows; must be 1..4096"},
        BadCase{"UnknownDtype",
                [](auto* r) { r->mutable_queries()->set_dtype(v1::DTYPE_UNSPECIFIED); }, kInvalid,
                "dtype DTYPE_UNSPECIFIED"},
        BadCase{"ByteLengthMismatch",
                [](auto* r) { r->mutable_queries()->mutable_data()->resize(10); }, kInvalid,
                "data holds 10 bytes but 3 x 8 DTYPE_FP32 needs 96"},
        BadCase{"Fp16BytesLabelledFp32",
                [](auto* r) { r->mutable_queries()->set_dtype(v1::DTYPE_FP16); }, kInvalid,
                "data holds 96 bytes but 3 x 8 DTYPE_FP16 needs 48"},
        BadCase{"NaN",
                [](auto* r) {
                  Matrix<float> m(3, kDim);
                  m.at(2, 5) = std::nanf("");
                  EncodeMatrix(m.view(), v1::DTYPE_FP32, r->mutable_queries());
                },
                kInvalid, "queries[2][5] is nan"},
        BadCase{"BeyondTheLargestMagnitude",
                [](auto* r) {
                  Matrix<float> m(3, kDim);
                  m.at(1, 2) = 1e20f;  // finite, but its squared distances overflow
                  EncodeMatrix(m.view(), v1::DTYPE_FP32, r->mutable_queries());
                },
                kInvalid, "queries[1][2] is 1e+20; queries must be finite and within"},
        BadCase{"Inf",
                [](auto* r) {
                  Matrix<float> m(3, kDim);
                  m.at(0, 1) = -INFINITY;
                  EncodeMatrix(m.view(), v1::DTYPE_FP16, r->mutable_queries());
                },
                kInvalid, "queries[0][1] is -inf"},
        BadCase{"KZero", [](auto* r) { r->mutable_params()->set_k(0); }, kInvalid,
                "params.k = 0; must be 1..1024"},
        BadCase{"KTooLarge", [](auto* r) { r->mutable_params()->set_k(1025); }, kInvalid,
                "params.k = 1025"},
        BadCase{"NegativeNprobe", [](auto* r) { r->mutable_params()->set_nprobe(-1); }, kInvalid,
                "params.nprobe = -1"},
        BadCase{"NegativeEfSearch", [](auto* r) { r->mutable_params()->set_ef_search(-2); },
                kInvalid, "params.ef_search = -2"},
        BadCase{"EfSearchAboveTheLimit", [](auto* r) { r->mutable_params()->set_ef_search(16385); },
                kInvalid, "params.ef_search = 16385; must be 0..16384"},
        BadCase{"NprobeAboveTheLimit", [](auto* r) { r->mutable_params()->set_nprobe(4097); },
                kInvalid, "params.nprobe = 4097; must be 0..4096"},
        BadCase{"UnknownSentence",
                [](auto* r) { r->mutable_subset_groups(0)->set_sentence_ids(1, 100); }, kInvalid,
                "subset_groups[0].sentence_ids[1] = 100 is not a sentence id"},
        BadCase{"NegativeSentence",
                [](auto* r) { r->mutable_subset_groups(1)->set_sentence_ids(0, -3); }, kInvalid,
                "subset_groups[1].sentence_ids[0] = -3"},
        BadCase{"DuplicateSentence",
                [](auto* r) { r->mutable_subset_groups(0)->set_sentence_ids(1, 1); }, kInvalid,
                "sentence id 1 appears more than once"},
        BadCase{"EmptyGroup", [](auto* r) { r->mutable_subset_groups(1)->clear_sentence_ids(); },
                kInvalid, "subset_groups[1]: 0 sentences"},
        BadCase{"RowGroupTooShort", [](auto* r) { r->mutable_row_group()->RemoveLast(); }, kInvalid,
                "row_group: 2 entries for 3 query rows"},
        BadCase{"RowGroupOutOfRange", [](auto* r) { r->set_row_group(2, 2); }, kInvalid,
                "row_group[2] = 2 is not a group index in [0, 2)"},
        BadCase{"RowGroupWithoutSubset", [](auto* r) { r->clear_subset_groups(); }, kInvalid,
                "row_group given without subset_groups"},
        BadCase{"SubsetWithoutCodes", [](auto*) {}, absl::StatusCode::kFailedPrecondition,
                "holds no subset codes"}),
    [](const auto& info) { return info.param.name; });

TEST(ParseSearchRequest, RejectsMoreSubsetIdsInAllThanTheRequestLimit) {
  RequestLimits limits;
  limits.max_total_subset_sentences = 3;
  EXPECT_THAT(ParseSearchRequest(ValidSubsetRequest(), kShape, limits),
              StatusIs(kInvalid, HasSubstr("4 sentence ids in all; at most 3 per request")));
}

TEST(ParseSearchRequest, StreamStepsCarryTheStreamsSubsetSession) {
  auto groups = std::make_shared<const SubsetGroups>(SubsetGroups{{3}});
  v1::SearchRequest step = ValidRequest(1);
  AddAll(step.mutable_row_group(), {0});
  ASSERT_OK_AND_ASSIGN(SearchQuery query,
                       ParseSearchRequest(step, kShape, kLimits, {groups, "stream-token"}));
  EXPECT_EQ(query.subset_session, "stream-token");
  EXPECT_EQ(query.queries_dtype, v1::DTYPE_FP32);
}

TEST(ParseSearchRequest, KeepsGroupsUnderTheirSessionAndReusesThem) {
  SubsetSessions sessions;
  v1::SearchRequest declare = ValidSubsetRequest();
  declare.set_subset_session("token");
  ASSERT_OK_AND_ASSIGN(SearchQuery declared,
                       ParseSearchRequest(declare, kShape, kLimits, {nullptr, "", &sessions}));
  const SubsetSessions::Kept kept = sessions.Get("token");
  EXPECT_EQ(kept.groups, declared.subset_groups);
  // Forwarded under the token minted for these groups, not under the client's.
  EXPECT_EQ(declared.subset_session, kept.forward_token);
  EXPECT_NE(declared.subset_session, "token");

  v1::SearchRequest step = ValidRequest(2);
  step.set_subset_session("token");
  AddAll(step.mutable_row_group(), {1, 0});
  ASSERT_OK_AND_ASSIGN(SearchQuery reused,
                       ParseSearchRequest(step, kShape, kLimits, {nullptr, "", &sessions}));
  EXPECT_EQ(reused.subset_groups, declared.subset_groups);  // shared, not copied
  EXPECT_EQ(reused.subset_session, declared.subset_session);
  EXPECT_EQ(reused.row_group, (std::vector<int32_t>{1, 0}));
}

TEST(ParseSearchRequest, UnknownSubsetSessionIsAFailedPreconditionOfItsOwn) {
  SubsetSessions sessions;
  v1::SearchRequest step = ValidRequest(1);
  step.set_subset_session("never declared");
  AddAll(step.mutable_row_group(), {0});
  // The stream's groups do not stand in for a token's: the token names other groups.
  const absl::StatusOr<SearchQuery> query = ParseSearchRequest(
      step, kShape, kLimits,
      {std::make_shared<const SubsetGroups>(SubsetGroups{{1}}), "stream", &sessions});
  EXPECT_THAT(query, StatusIs(absl::StatusCode::kFailedPrecondition,
                              HasSubstr("send the request again with its subset_groups")));
  EXPECT_TRUE(IsUnknownSubsetSession(query.status()));
  EXPECT_FALSE(IsUnknownSubsetSession(absl::FailedPreconditionError("holds no subset codes")));
  // Without a store every token is unknown.
  EXPECT_TRUE(IsUnknownSubsetSession(ParseSearchRequest(step, kShape, kLimits).status()));
}

TEST(ParseSearchRequest, InvalidRequestDoesNotKeepItsGroups) {
  SubsetSessions sessions;
  v1::SearchRequest request = ValidSubsetRequest();
  request.set_subset_session("token");
  request.mutable_row_group()->Set(0, 7);
  EXPECT_THAT(ParseSearchRequest(request, kShape, kLimits, {nullptr, "", &sessions}),
              StatusIs(kInvalid, HasSubstr("row_group[0] = 7")));
  EXPECT_EQ(sessions.Get("token").groups, nullptr);
}

TEST(ParseSearchRequest, RejectsAnOverlongSubsetSession) {
  v1::SearchRequest request = ValidSubsetRequest();
  request.set_subset_session(std::string(kMaxSubsetSessionBytes + 1, 'x'));
  EXPECT_THAT(ParseSearchRequest(request, kShape, kLimits),
              StatusIs(kInvalid, HasSubstr("subset_session: 65 bytes; at most 64")));
}

// A request_id is forwarded to every shard and echoed in the answer: it is bounded.
TEST(ParseSearchRequest, RejectsAnOverlongRequestId) {
  v1::SearchRequest request = ValidSubsetRequest();
  request.set_request_id(std::string(kMaxRequestIdBytes, 'x'));
  EXPECT_OK(ParseSearchRequest(request, kShape, kLimits).status());
  request.set_request_id(std::string(kMaxRequestIdBytes + 1, 'x'));
  EXPECT_THAT(ParseSearchRequest(request, kShape, kLimits),
              StatusIs(kInvalid, HasSubstr("request_id: 257 bytes; at most 256")));
}

TEST(RequestLimits, MessageSizeCoversAFullQueryMatrixAndTheLargestAnswerAndFitsGrpc) {
  EXPECT_GE(kLimits.MaxMessageBytes(1024), int64_t{4096} * 1024 * 4);
  EXPECT_LT(kLimits.MaxMessageBytes(4096), int64_t{1} << 31);  // gRPC takes an int
  // The largest answer: every row's max_k neighbours missing (the longest varints), with
  // coverage.
  v1::SearchResponse answer;
  EncodeNeighbors(Neighbors::Missing(kLimits.max_rows, kLimits.max_k, Metric::kL2,
                                     /*with_values=*/true),
                  &answer);
  answer.mutable_coverage()->set_vectors_total(int64_t{1} << 40);
  EXPECT_LE(static_cast<int64_t>(answer.ByteSizeLong()), kLimits.MaxMessageBytes(16));
  v1::Limits limits;
  kLimits.ToProto(512, &limits);
  EXPECT_EQ(limits.max_k(), 1024);
  EXPECT_EQ(limits.max_ef_search(), 16384);
  EXPECT_EQ(limits.max_nprobe(), 4096);
  EXPECT_EQ(limits.max_message_bytes(), kLimits.MaxMessageBytes(512));
}

}  // namespace
}  // namespace knnserve
