#include "tests/server/flat_engine.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>

namespace knnserve::testing {

std::shared_ptr<const Datastore> MakeDatastore(int64_t num_sentences, int dim, int max_length,
                                               uint32_t seed, Metric metric) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> length(1, max_length);
  auto data = std::make_shared<Datastore>();
  data->metric = metric;
  data->sentence_offsets.push_back(0);
  for (int64_t s = 0; s < num_sentences; ++s) {
    data->sentence_offsets.push_back(data->sentence_offsets.back() + length(rng));
  }
  const int64_t tokens = data->sentence_offsets.back();
  data->keys = Matrix<float>(tokens, dim);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < data->keys.size(); ++i) data->keys.data()[i] = normal(rng);
  std::uniform_int_distribution<int32_t> vocab(4, 999);
  for (int64_t i = 0; i < tokens; ++i) data->values.push_back(vocab(rng));
  return data;
}

FlatEngine::FlatEngine(std::shared_ptr<const Datastore> data, int64_t sentence_begin,
                       int64_t sentence_end)
    : data_(std::move(data)) {
  info_.dim = static_cast<int>(data_->keys.cols());
  info_.metric = data_->metric;
  info_.factory = "Flat";
  info_.total_vectors = data_->keys.rows();
  info_.id_begin = data_->sentence_offsets[sentence_begin];
  info_.id_end = data_->sentence_offsets[sentence_end];
  info_.num_sentences = data_->num_sentences();
  info_.sentence_begin = sentence_begin;
  info_.sentence_end = sentence_end;
  info_.has_values = true;
}

void FlatEngine::SearchRow(const float* query,
                           const std::vector<std::pair<int64_t, int64_t>>& ranges, int k,
                           Neighbors* out, int64_t row) const {
  const Metric metric = info_.metric;
  std::vector<std::pair<float, int64_t>> scored;
  for (const auto& [begin, end] : ranges) {
    for (int64_t id = begin; id < end; ++id) {
      const float* key = data_->keys.row(id);
      float score = 0;
      for (int d = 0; d < info_.dim; ++d) {
        if (metric == Metric::kL2) {
          const float diff = query[d] - key[d];
          score += diff * diff;
        } else {
          score += query[d] * key[d];
        }
      }
      scored.emplace_back(score, id);
    }
  }
  const size_t keep = std::min<size_t>(k, scored.size());
  std::partial_sort(scored.begin(), scored.begin() + keep, scored.end(),
                    [metric](const auto& a, const auto& b) {
                      return RanksBefore(metric, a.first, a.second, b.first, b.second);
                    });
  for (size_t j = 0; j < keep; ++j) {
    out->distances[row * k + j] = scored[j].first;
    out->ids[row * k + j] = scored[j].second;
    out->values[row * k + j] = data_->values[scored[j].second];
  }
}

absl::StatusOr<EngineResult> FlatEngine::Search(const SearchQuery& query) const {
  const int k = query.params.k;
  EngineResult result;
  result.neighbors = Neighbors::Missing(query.queries.rows(), k, info_.metric, true);
  const std::vector<std::pair<int64_t, int64_t>> all = {{info_.id_begin, info_.id_end}};
  std::vector<std::vector<std::pair<int64_t, int64_t>>> group_ranges;
  if (query.is_subset()) {
    std::vector<bool> used(query.subset_groups->size());
    for (int32_t g : query.row_group) used[g] = true;
    for (size_t g = 0; g < query.subset_groups->size(); ++g) {
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (int64_t s : (*query.subset_groups)[g]) {
        if (s < info_.sentence_begin || s >= info_.sentence_end) continue;
        ranges.emplace_back(data_->sentence_offsets[s], data_->sentence_offsets[s + 1]);
        if (used[g]) result.vectors_searched += ranges.back().second - ranges.back().first;
      }
      group_ranges.push_back(std::move(ranges));
    }
  } else {
    result.vectors_searched = info_.id_end - info_.id_begin;
  }
  for (int64_t r = 0; r < query.queries.rows(); ++r) {
    SearchRow(query.queries.row(r), query.is_subset() ? group_ranges[query.row_group[r]] : all, k,
              &result.neighbors, r);
  }
  return result;
}

std::vector<std::unique_ptr<SearchEngine>> MakeShardEngines(
    const std::shared_ptr<const Datastore>& data, int num_shards) {
  std::vector<std::unique_ptr<SearchEngine>> engines;
  const int64_t sentences = data->num_sentences();
  for (int s = 0; s < num_shards; ++s) {
    engines.push_back(std::make_unique<FlatEngine>(data, sentences * s / num_shards,
                                                   sentences * (s + 1) / num_shards));
  }
  return engines;
}

}  // namespace knnserve::testing
