#include "common/wire.h"

#include <cmath>
#include <random>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve {
namespace {

using ::knnserve::testing::StatusIs;
using ::testing::HasSubstr;

Matrix<float> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Matrix<float> m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

TEST(MatrixCodec, Fp32RoundTripIsExact) {
  const Matrix<float> m = RandomMatrix(7, 13, 1);
  v1::Matrix packed;
  EncodeMatrix(m.view(), v1::DTYPE_FP32, &packed);
  EXPECT_EQ(packed.data().size(), 7u * 13 * 4);
  ASSERT_OK_AND_ASSIGN(Matrix<float> decoded, DecodeMatrix(packed, "queries"));
  EXPECT_EQ(decoded, m);
}

TEST(MatrixCodec, Fp16RoundTripIsWithinHalfPrecision) {
  const Matrix<float> m = RandomMatrix(5, 17, 2);  // 85 elements: SIMD body and scalar tail
  v1::Matrix packed;
  EncodeMatrix(m.view(), v1::DTYPE_FP16, &packed);
  EXPECT_EQ(packed.data().size(), 5u * 17 * 2);
  ASSERT_OK_AND_ASSIGN(Matrix<float> decoded, DecodeMatrix(packed, "queries"));
  ASSERT_EQ(decoded.rows(), 5);
  ASSERT_EQ(decoded.cols(), 17);
  for (int64_t i = 0; i < m.size(); ++i) {
    // binary16 has an 11-bit significand: relative error <= 2^-11.
    EXPECT_NEAR(decoded.data()[i], m.data()[i], std::fabs(m.data()[i]) * 0x1p-11 + 1e-7);
  }
}

TEST(MatrixCodec, PackedBytesAreLittleEndian) {
  Matrix<float> m(1, 1, {1.0f});
  v1::Matrix packed;
  EncodeMatrix(m.view(), v1::DTYPE_FP32, &packed);
  EXPECT_EQ(packed.data(), std::string("\x00\x00\x80\x3f", 4));
  EncodeMatrix(m.view(), v1::DTYPE_FP16, &packed);
  EXPECT_EQ(packed.data(), std::string("\x00\x3c", 2));
}

TEST(MatrixCodec, RejectsByteLengthMismatch) {
  v1::Matrix packed;
  packed.set_rows(2);
  packed.set_cols(3);
  packed.set_dtype(v1::DTYPE_FP32);
  packed.set_data(std::string(23, '\0'));
  EXPECT_THAT(DecodeMatrix(packed, "queries"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("queries: data holds 23 bytes but 2 x 3 DTYPE_FP32 needs 24")));
}

TEST(MatrixCodec, RejectsUnspecifiedAndUnknownDtypes) {
  v1::Matrix packed;
  packed.set_rows(1);
  packed.set_cols(1);
  EXPECT_THAT(DecodeMatrix(packed, "queries"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("DTYPE_UNSPECIFIED")));
  packed.set_dtype(static_cast<v1::DType>(7));
  EXPECT_THAT(DecodeMatrix(packed, "queries"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(7) is not supported")));
}

TEST(MatrixCodec, RejectsNegativeAndOverflowingShapes) {
  v1::Matrix packed;
  packed.set_dtype(v1::DTYPE_FP16);
  packed.set_rows(-1);
  packed.set_cols(4);
  EXPECT_THAT(DecodeMatrix(packed, "q"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative shape")));
  packed.set_rows(int64_t{1} << 40);
  packed.set_cols(int64_t{1} << 40);
  EXPECT_THAT(DecodeMatrix(packed, "q"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
}

TEST(NeighborsCodec, RoundTripsThroughASerializedResponse) {
  Neighbors n = Neighbors::Missing(2, 3, Metric::kL2, true);
  n.distances = {0.5f, 1.5f, 2.5f, 0.1f, 0.2f, INFINITY};
  n.ids = {10, 11, 12, 20, 21, -1};
  n.values = {5, 6, 7, 8, 9, -1};
  v1::SearchResponse response;
  EncodeNeighbors(n, &response);
  v1::SearchResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(response.SerializeAsString()));
  ASSERT_OK_AND_ASSIGN(Neighbors decoded, DecodeNeighbors(parsed));
  EXPECT_EQ(decoded.rows, 2);
  EXPECT_EQ(decoded.k, 3);
  EXPECT_EQ(decoded.distances, n.distances);
  EXPECT_EQ(decoded.ids, n.ids);
  EXPECT_EQ(decoded.values, n.values);
}

TEST(NeighborsCodec, RejectsArraysThatDisagreeWithTheShape) {
  v1::SearchResponse response;
  response.set_rows(2);
  response.set_k(2);
  response.add_distances(1.0f);
  EXPECT_THAT(DecodeNeighbors(response),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows x k = 2 x 2")));
}

TEST(Proto, SearchRequestRoundTripsThroughTheWire) {
  v1::StreamRequest request;
  v1::SearchRequest* step = request.mutable_step();
  EncodeMatrix(RandomMatrix(3, 8, 3).view(), v1::DTYPE_FP16, step->mutable_queries());
  step->mutable_params()->set_k(64);
  step->mutable_params()->set_nprobe(32);
  step->add_subset_groups()->add_sentence_ids(17);
  step->add_row_group(0);
  step->add_row_group(0);
  step->add_row_group(0);
  step->set_request_id("session-1/step-4");
  v1::StreamRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(request.SerializeAsString()));
  EXPECT_EQ(parsed.SerializeAsString(), request.SerializeAsString());
  EXPECT_EQ(parsed.kind_case(), v1::StreamRequest::kStep);
  EXPECT_EQ(parsed.step().queries().data(), step->queries().data());
  EXPECT_EQ(parsed.step().params().nprobe(), 32);
  EXPECT_EQ(parsed.step().subset_groups(0).sentence_ids(0), 17);
}

TEST(Proto, MetricConvertsBothWays) {
  for (Metric m : {Metric::kL2, Metric::kInnerProduct}) {
    ASSERT_OK_AND_ASSIGN(Metric back, MetricFromProto(MetricToProto(m)));
    EXPECT_EQ(back, m);
  }
  EXPECT_THAT(MetricFromProto(v1::METRIC_UNSPECIFIED),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("METRIC_UNSPECIFIED")));
}

}  // namespace
}  // namespace knnserve
