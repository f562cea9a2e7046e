// Comparing search answers that went through different faiss objects (shards vs one index).
#ifndef KNNSERVE_TESTS_TESTING_NEIGHBORS_H_
#define KNNSERVE_TESTS_TESTING_NEIGHBORS_H_

#include <algorithm>
#include <cmath>

#include "common/search_types.h"
#include "gtest/gtest.h"

namespace knnserve::testing {

// Same ids in the same order, distances equal up to float rounding: faiss computes exact L2 as
// |x|^2 + |y|^2 - 2<x,y> with BLAS, whose summation order depends on the database size and
// thread count, so a shard's distances may differ from the unsharded index's in the last bits.
inline void ExpectSameNeighborsUpToRounding(const Neighbors& want, const Neighbors& got) {
  EXPECT_EQ(got.ids, want.ids);
  ASSERT_EQ(got.distances.size(), want.distances.size());
  for (size_t i = 0; i < want.distances.size(); ++i) {
    const float w = want.distances[i];
    EXPECT_NEAR(got.distances[i], w, 1e-5f * std::max(1.0f, std::abs(w))) << "result " << i;
  }
}

}  // namespace knnserve::testing

#endif  // KNNSERVE_TESTS_TESTING_NEIGHBORS_H_
