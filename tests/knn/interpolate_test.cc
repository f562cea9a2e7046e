// p_kNN by scatter-add and the log-space interpolation, against a direct computation.
#include <cmath>
#include <limits>

#include "client/knn/knn_processor.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve::knn {
namespace {

using ::testing::HasSubstr;

Neighbors MakeNeighbors(int64_t rows, int k, std::vector<float> distances,
                        std::vector<int32_t> values) {
  Neighbors n;
  n.rows = rows;
  n.k = k;
  n.distances = std::move(distances);
  n.values = std::move(values);
  for (int32_t v : n.values) n.ids.push_back(v < 0 ? -1 : 100 + v);
  return n;
}

// The interpolation of a copy of lp (InterpolateKnn rewrites its argument).
absl::StatusOr<torch::Tensor> Interpolated(const torch::Tensor& lp, const Neighbors& n,
                                           const KnnOptions& options) {
  torch::Tensor out = lp.clone();
  RETURN_IF_ERROR(InterpolateKnn(n, Metric::kL2, options, out));
  return out;
}

KnnOptions WeightAndTemperature(double weight, double temperature) {
  KnnOptions options;
  options.weight = weight;
  options.temperature = temperature;
  return options;
}

TEST(InterpolateKnnTest, MatchesTheFormula) {
  const torch::Tensor lp = torch::log_softmax(torch::tensor({{1.0f, 2.0f, 0.5f, -1.0f}}), 1);
  // Two neighbours vote for token 1, one for token 3.
  const Neighbors n = MakeNeighbors(1, 3, {1.0f, 2.0f, 4.0f}, {1, 3, 1});
  KnnOptions options;
  options.temperature = 2;
  options.weight = 0.3;
  ASSERT_OK_AND_ASSIGN(torch::Tensor out, Interpolated(lp, n, options));
  const double w1 = std::exp(-0.5), w3 = std::exp(-1.0), w1b = std::exp(-2.0);
  const double z = w1 + w3 + w1b;
  const double p_knn[4] = {0, (w1 + w1b) / z, 0, w3 / z};
  for (int y = 0; y < 4; ++y) {
    const double expected = std::log(0.3 * p_knn[y] + 0.7 * std::exp(lp[0][y].item<double>()));
    EXPECT_NEAR(out[0][y].item<double>(), expected, 1e-6) << "token " << y;
  }
  EXPECT_NEAR(out.exp().sum().item<double>(), 1.0, 1e-6);
}

TEST(InterpolateKnnTest, WeightZeroIsExactlyTheModel) {
  const torch::Tensor lp = torch::log_softmax(torch::randn({3, 10}), 1);
  const Neighbors n = MakeNeighbors(3, 2, {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6});
  KnnOptions options;
  options.weight = 0;
  ASSERT_OK_AND_ASSIGN(torch::Tensor out, Interpolated(lp, n, options));
  EXPECT_TRUE(torch::equal(out, lp));
}

TEST(InterpolateKnnTest, WeightOneIsKnnAloneWithoutNaNOrInfinity) {
  const torch::Tensor lp = torch::log_softmax(torch::randn({1, 6}), 1);
  const Neighbors n = MakeNeighbors(1, 2, {0.0f, 1e30f}, {4, 5});
  ASSERT_OK_AND_ASSIGN(torch::Tensor out, Interpolated(lp, n, WeightAndTemperature(1, 1)));
  EXPECT_FALSE(out.isnan().any().item<bool>());
  EXPECT_NEAR(out[0][4].item<double>(), 0.0, 1e-6);  // p = 1
  EXPECT_FALSE(out.isinf().any().item<bool>());
  EXPECT_EQ(out[0][0].item<float>(), -1e9f);  // no vote, no model share: the finite floor
  EXPECT_EQ(out[0][5].item<float>(), -1e9f);  // exp(-1e30) underflows to nothing
}

// A vote whose weight exp(-d/τ) is below double's range next to the nearest one adds nothing:
// its token keeps (1 - λ) p_MT, finite, and the near vote's token gets λ + (1 - λ) p_MT.
TEST(InterpolateKnnTest, AVoteTooFarToCountLeavesItsTokenTheModelsShare) {
  const torch::Tensor lp = torch::log_softmax(torch::randn({1, 6}), 1);
  const Neighbors n = MakeNeighbors(1, 2, {1.0f, 1e30f}, {2, 4});
  ASSERT_OK_AND_ASSIGN(torch::Tensor out, Interpolated(lp, n, WeightAndTemperature(0.25, 1)));
  const double p2 = std::exp(lp[0][2].item<double>()), p4 = std::exp(lp[0][4].item<double>());
  EXPECT_NEAR(out[0][2].item<double>(), std::log(0.25 + 0.75 * p2), 1e-6);
  EXPECT_NEAR(out[0][4].item<double>(), std::log(0.75 * p4), 1e-6);
  EXPECT_FALSE(out.isinf().any().item<bool>());
}

TEST(InterpolateKnnTest, RowsWithoutUsableNeighboursKeepTheModel) {
  const torch::Tensor lp = torch::log_softmax(torch::randn({2, 5}), 1);
  // Row 0: only missing neighbours; row 1: beyond the threshold.
  const Neighbors n = MakeNeighbors(
      2, 2,
      {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(), 50, 60},
      {-1, -1, 2, 3});
  KnnOptions options;
  options.weight = 0.9;
  options.threshold = 40;
  ASSERT_OK_AND_ASSIGN(torch::Tensor out, Interpolated(lp, n, options));
  EXPECT_TRUE(torch::equal(out, lp));
}

// Rows with and without votes in one call, against the formula computed directly in double:
// voted rows mix the two distributions (−1e9 where both are zero), the others keep p_MT exactly.
TEST(InterpolateKnnTest, MixedRowsMatchTheFormulaRowByRow) {
  torch::manual_seed(3);
  const torch::Tensor lp = torch::log_softmax(torch::randn({4, 12}), 1);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // Row 0 votes for tokens 5 and 7, row 2 twice for token 5; rows 1 and 3 retrieved nothing.
  const Neighbors n =
      MakeNeighbors(4, 2, {1, 3, kInf, kInf, 2, 2.5, kInf, kInf}, {5, 7, -1, -1, 5, 5, -1, -1});
  for (double weight : {0.3, 1.0}) {
    SCOPED_TRACE(weight);
    KnnOptions options;
    options.temperature = 2;
    options.weight = weight;
    ASSERT_OK_AND_ASSIGN(torch::Tensor out, Interpolated(lp, n, options));
    for (int r = 0; r < 4; ++r) {
      if (r % 2 == 1) {
        EXPECT_TRUE(torch::equal(out[r], lp[r])) << "row " << r;
        continue;
      }
      double mass[12] = {};
      double z = 0;
      for (int j = 0; j < 2; ++j) {
        const double w = std::exp(-n.distances[r * 2 + j] / 2.0);
        mass[n.values[r * 2 + j]] += w;
        z += w;
      }
      for (int y = 0; y < 12; ++y) {
        const double p = weight * mass[y] / z + (1 - weight) * std::exp(lp[r][y].item<double>());
        if (p == 0) {
          EXPECT_EQ(out[r][y].item<float>(), -1e9f) << r << " " << y;
        } else {
          EXPECT_NEAR(out[r][y].item<double>(), std::log(p), 1e-5) << r << " " << y;
        }
      }
    }
  }
}

// A CPU float32 contiguous tensor is rewritten in its own storage; a double one is replaced by
// its interpolated float copy, with the same values.
TEST(InterpolateKnnTest, RewritesAFloatTensorInPlace) {
  const torch::Tensor lp = torch::log_softmax(torch::randn({2, 7}), 1);
  const Neighbors n = MakeNeighbors(2, 2, {1, 2, 3, 4}, {1, 2, 3, 1});
  KnnOptions options;
  options.weight = 0.5;
  ASSERT_OK_AND_ASSIGN(const torch::Tensor want, Interpolated(lp, n, options));
  torch::Tensor in_place = lp.clone();
  const void* storage = in_place.data_ptr();
  ASSERT_OK(InterpolateKnn(n, Metric::kL2, options, in_place));
  EXPECT_EQ(in_place.data_ptr(), storage);
  EXPECT_TRUE(torch::equal(in_place, want));
  torch::Tensor as_double = lp.to(torch::kDouble);
  ASSERT_OK(InterpolateKnn(n, Metric::kL2, options, as_double));
  EXPECT_EQ(as_double.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(as_double, want));
}

TEST(InterpolateKnnTest, RejectsMismatchedRowsAndMissingValues) {
  const torch::Tensor lp = torch::zeros({2, 5});
  Neighbors n = MakeNeighbors(1, 1, {1}, {1});
  EXPECT_THAT(Interpolated(lp, n, {}).status().message(), HasSubstr("1 neighbour rows"));
  n = MakeNeighbors(2, 1, {1, 1}, {1, 1});
  n.values.clear();
  EXPECT_THAT(Interpolated(lp, n, {}).status().message(), HasSubstr("no values"));
}

TEST(KnnOptionsTest, NamesTheBadFlag) {
  KnnOptions options;
  options.weight = 1.5;
  EXPECT_THAT(ValidateKnnOptions(options).message(), HasSubstr("--knn-weight"));
  options = {};
  options.temperature = 0;
  EXPECT_THAT(ValidateKnnOptions(options).message(), HasSubstr("--knn-temperature"));
  options.temperature = 1e-320;  // positive, but -d/τ overflows (from --knn-config or a grid)
  EXPECT_THAT(ValidateKnnOptions(options).message(), HasSubstr("--knn-temperature"));
  options = {};
  options.k = 0;
  EXPECT_THAT(ValidateKnnOptions(options).message(), HasSubstr("--knn-topk"));
}

}  // namespace
}  // namespace knnserve::knn
