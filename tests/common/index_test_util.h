// Seeded synthetic datastores for the index tests: clustered keys, sentences of random length,
// random values, and helpers to build and query index directories.
#ifndef KNNSERVE_TESTS_COMMON_INDEX_TEST_UTIL_H_
#define KNNSERVE_TESTS_COMMON_INDEX_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/datastore/key_source.h"
#include "common/matrix.h"
#include "common/request.h"
#include "gtest/gtest.h"

namespace knnserve::testing {

struct Datastore {
  Matrix<float> keys;
  DatastoreValues values;
};

// n keys of dimension d around `clusters` Gaussian centres, in sentences of 1..max_len tokens.
inline Datastore MakeDatastore(int64_t n, int d, int clusters, uint64_t seed, int max_len = 24) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Matrix<float> centres(clusters, d);
  for (int64_t i = 0; i < centres.size(); ++i) centres.data()[i] = 4.0f * normal(rng);
  Datastore ds{Matrix<float>(n, d), {}};
  std::uniform_int_distribution<int> pick(0, clusters - 1);
  for (int64_t i = 0; i < n; ++i) {
    const float* c = centres.row(pick(rng));
    for (int j = 0; j < d; ++j) ds.keys.at(i, j) = c[j] + normal(rng);
  }
  std::uniform_int_distribution<int> len(1, max_len);
  std::uniform_int_distribution<int32_t> token(0, 31999);
  ds.values.offsets.push_back(0);
  while (ds.values.offsets.back() < n) {
    ds.values.offsets.push_back(std::min<int64_t>(n, ds.values.offsets.back() + len(rng)));
  }
  ds.values.tokens.resize(n);
  for (int32_t& t : ds.values.tokens) t = token(rng);
  return ds;
}

// Queries near stored keys (perturbed copies of random rows).
inline Matrix<float> MakeQueries(const Matrix<float>& keys, int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::uniform_int_distribution<int64_t> pick(0, keys.rows() - 1);
  Matrix<float> q(rows, keys.cols());
  for (int64_t r = 0; r < rows; ++r) {
    const float* k = keys.row(pick(rng));
    for (int64_t j = 0; j < keys.cols(); ++j) q.at(r, j) = k[j] + normal(rng);
  }
  return q;
}

inline SearchQuery FullQuery(const Matrix<float>& queries, int k, int nprobe = 0) {
  SearchQuery q;
  q.queries = queries;
  q.params.k = k;
  q.params.nprobe = nprobe;
  return q;
}

// Every row gets its own group of `per_group` random sentences, except that rows are paired
// into beams of `beam` rows sharing one group.
inline SearchQuery SubsetQuery(const Matrix<float>& queries, int k, int64_t num_sentences,
                               int per_group, int beam, uint64_t seed) {
  SearchQuery q = FullQuery(queries, k);
  std::mt19937_64 rng(seed);
  auto groups = std::make_shared<SubsetGroups>();
  for (int64_t r = 0; r < queries.rows(); ++r) {
    if (r % beam == 0) {
      std::vector<int64_t> all(num_sentences);
      for (int64_t s = 0; s < num_sentences; ++s) all[s] = s;
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(std::min<int64_t>(per_group, num_sentences));
      groups->push_back(std::move(all));
    }
    q.row_group.push_back(static_cast<int32_t>(groups->size() - 1));
  }
  q.subset_groups = std::move(groups);
  return q;
}

}  // namespace knnserve::testing

#endif  // KNNSERVE_TESTS_COMMON_INDEX_TEST_UTIL_H_
