#include "common/topk.h"

#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve {
namespace {

using ::knnserve::testing::StatusIs;
using ::testing::HasSubstr;

struct Candidate {
  float distance;
  int64_t id;
  int32_t value;
};

// A part as a search returns it: each row sorted, padded with missing neighbours to k.
Neighbors MakePart(const std::vector<std::vector<Candidate>>& rows, int k, Metric metric) {
  Neighbors part = Neighbors::Missing(rows.size(), k, metric, /*with_values=*/true);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<Candidate> row = rows[r];
    std::sort(row.begin(), row.end(), [metric](const Candidate& a, const Candidate& b) {
      return RanksBefore(metric, a.distance, a.id, b.distance, b.id);
    });
    for (int j = 0; j < k && j < static_cast<int>(row.size()); ++j) {
      part.distances[r * k + j] = row[j].distance;
      part.ids[r * k + j] = row[j].id;
      part.values[r * k + j] = row[j].value;
    }
  }
  return part;
}

class TopKMergeRandom : public ::testing::TestWithParam<Metric> {};

// The reference: concatenate every part's candidates, sort, keep k.
TEST_P(TopKMergeRandom, EqualsSortOfConcatenation) {
  const Metric metric = GetParam();
  std::mt19937 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    const int num_parts = 1 + rng() % 6;
    const int rows = 1 + rng() % 5;
    const int k = 1 + rng() % 20;
    std::vector<Neighbors> parts;
    std::vector<std::vector<Candidate>> all(rows);
    int64_t next_id = 0;
    for (int p = 0; p < num_parts; ++p) {
      const int part_k = 1 + rng() % 25;  // parts may carry more or fewer than k
      std::vector<std::vector<Candidate>> part_rows(rows);
      for (int r = 0; r < rows; ++r) {
        const int n = rng() % (part_k + 3);  // sometimes fewer than part_k: missing entries
        for (int i = 0; i < n; ++i) {
          // Few distinct distances so that ties are common and must be broken by id.
          part_rows[r].push_back(
              {static_cast<float>(rng() % 7), next_id++, static_cast<int32_t>(rng() % 100)});
        }
      }
      parts.push_back(MakePart(part_rows, part_k, metric));
      for (int r = 0; r < rows; ++r) {
        const int kept = std::min<int>(part_k, part_rows[r].size());
        for (int j = 0; j < kept; ++j) {
          all[r].push_back({parts.back().distances[r * part_k + j],
                            parts.back().ids[r * part_k + j], parts.back().values[r * part_k + j]});
        }
      }
    }
    std::vector<const Neighbors*> part_ptrs;
    for (const Neighbors& p : parts) part_ptrs.push_back(&p);
    ASSERT_OK_AND_ASSIGN(Neighbors merged, MergeTopK(part_ptrs, k, metric));
    const Neighbors expected = MakePart(all, k, metric);
    EXPECT_EQ(merged.rows, rows);
    EXPECT_EQ(merged.k, k);
    EXPECT_EQ(merged.ids, expected.ids) << "trial " << trial;
    EXPECT_EQ(merged.distances, expected.distances) << "trial " << trial;
    EXPECT_EQ(merged.values, expected.values) << "trial " << trial;
  }
}

INSTANTIATE_TEST_SUITE_P(Metrics, TopKMergeRandom,
                         ::testing::Values(Metric::kL2, Metric::kInnerProduct),
                         [](const auto& info) { return std::string(MetricName(info.param)); });

TEST(TopKMerge, TiesAreBrokenBySmallerIdWhateverThePartOrder) {
  const Neighbors a = MakePart({{{1.0f, 9, 90}, {2.0f, 3, 30}}}, 2, Metric::kL2);
  const Neighbors b = MakePart({{{1.0f, 4, 40}, {2.0f, 1, 10}}}, 2, Metric::kL2);
  ASSERT_OK_AND_ASSIGN(Neighbors ab, MergeTopK({&a, &b}, 4, Metric::kL2));
  ASSERT_OK_AND_ASSIGN(Neighbors ba, MergeTopK({&b, &a}, 4, Metric::kL2));
  EXPECT_EQ(ab.ids, (std::vector<int64_t>{4, 9, 1, 3}));
  EXPECT_EQ(ba.ids, ab.ids);
  EXPECT_EQ(ab.values, (std::vector<int32_t>{40, 90, 10, 30}));
}

TEST(TopKMerge, PadsWithMissingWhenPartsHoldFewerThanK) {
  const Neighbors a = MakePart({{{0.5f, 7, 1}}}, 3, Metric::kL2);
  ASSERT_OK_AND_ASSIGN(Neighbors merged, MergeTopK({&a}, 3, Metric::kL2));
  EXPECT_EQ(merged.ids, (std::vector<int64_t>{7, -1, -1}));
  EXPECT_EQ(merged.values, (std::vector<int32_t>{1, -1, -1}));
  EXPECT_EQ(merged.distances[2], WorstDistance(Metric::kL2));
}

TEST(TopKMerge, DropsValuesUnlessEveryPartHasThem) {
  const Neighbors a = MakePart({{{0.5f, 7, 1}}}, 1, Metric::kL2);
  Neighbors b = MakePart({{{0.25f, 8, 2}}}, 1, Metric::kL2);
  b.values.clear();
  ASSERT_OK_AND_ASSIGN(Neighbors merged, MergeTopK({&a, &b}, 2, Metric::kL2));
  EXPECT_EQ(merged.ids, (std::vector<int64_t>{8, 7}));
  EXPECT_FALSE(merged.has_values());
}

// IsMergedTopK says yes only when merging the part alone returns it unchanged.
TEST_P(TopKMergeRandom, IsMergedTopKMeansMergingAloneChangesNothing) {
  const Metric metric = GetParam();
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> count(0, 6);
  std::uniform_real_distribution<float> distance(0, 1);
  int merged_seen = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::vector<Candidate>> rows(3);
    for (auto& row : rows) {
      const int n = count(rng);
      for (int i = 0; i < n; ++i) row.push_back({distance(rng), trial * 100 + i, i});
    }
    Neighbors part = MakePart(rows, 4, metric);
    if (trial % 3 == 1) part.values.clear();
    if (trial % 5 == 2) part.distances.back() = 0.5f;  // a missing entry that is not Missing's
    if (trial % 7 == 3) part.values.assign(part.values.size(), -1);
    for (const int k : {4, 3}) {
      ASSERT_OK_AND_ASSIGN(Neighbors merged, MergeTopK({&part}, k, metric));
      const bool same = merged.ids == part.ids && merged.values == part.values &&
                        merged.distances == part.distances && merged.k == part.k;
      if (IsMergedTopK(part, k, metric)) {
        EXPECT_TRUE(same) << trial;
        ++merged_seen;
      }
      if (k != part.k) EXPECT_FALSE(IsMergedTopK(part, k, metric));
    }
  }
  EXPECT_GT(merged_seen, 50);
}

TEST(TopKMerge, IsMergedTopKRefusesMissingEntriesUnlikeMissingOnes) {
  Neighbors part = MakePart({{{0.5f, 7, 1}}}, 3, Metric::kL2);
  EXPECT_TRUE(IsMergedTopK(part, 3, Metric::kL2));
  part.distances[2] = 0.0f;  // id -1 with a distance merging would replace
  EXPECT_FALSE(IsMergedTopK(part, 3, Metric::kL2));
  part = MakePart({{{0.5f, 7, 1}}}, 3, Metric::kL2);
  part.ids[2] = -2;
  EXPECT_FALSE(IsMergedTopK(part, 3, Metric::kL2));
  part = MakePart({{{0.5f, 7, 1}}}, 3, Metric::kL2);
  part.ids.pop_back();  // inconsistently sized
  EXPECT_FALSE(IsMergedTopK(part, 3, Metric::kL2));
}

TEST(TopKMerge, RejectsPartsWithDifferentRowCounts) {
  const Neighbors a = Neighbors::Missing(2, 3, Metric::kL2, false);
  const Neighbors b = Neighbors::Missing(3, 3, Metric::kL2, false);
  EXPECT_THAT(MergeTopK({&a, &b}, 3, Metric::kL2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("part 1 has 3 rows")));
}

TEST(TopKMerge, RejectsInconsistentlySizedParts) {
  Neighbors a = Neighbors::Missing(2, 3, Metric::kL2, false);
  a.ids.pop_back();
  EXPECT_THAT(MergeTopK({&a}, 3, Metric::kL2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("do not match")));
}

}  // namespace
}  // namespace knnserve
