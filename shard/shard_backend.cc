#include "shard/shard_backend.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/wire.h"

namespace knnserve {
namespace {

absl::Status Loading(int32_t shard_id) {
  return absl::UnavailableError(absl::StrCat("shard ", shard_id, " is loading"));
}

SearchAnswer ToAnswer(EngineResult result, bool subset, int64_t slice_vectors) {
  SearchAnswer answer;
  answer.neighbors = std::move(result.neighbors);
  v1::Coverage& coverage = answer.coverage;
  coverage.set_shards_asked(1);
  coverage.set_shards_answered(1);
  coverage.set_vectors_searched(result.vectors_searched);
  // A full search covers the whole slice; a subset search everything the subset holds here.
  coverage.set_vectors_total(subset ? result.vectors_searched : slice_vectors);
  return answer;
}

}  // namespace

SearchQuery WarmUpQuery(const EngineInfo& info) {
  SearchQuery query;
  query.queries = Matrix<float>(1, info.dim);
  query.params.k = 1;
  query.request_id = "warm-up";
  if (info.subset_only) {
    query.subset_groups = std::make_shared<const SubsetGroups>(SubsetGroups{{info.sentence_begin}});
    query.row_group = {0};
  }
  return query;
}

ShardBackend::ShardBackend(int32_t shard_id, BatcherOptions options, MetricsRegistry* metrics)
    : shard_id_(shard_id), options_(options), metrics_(metrics) {}

ShardBackend::~ShardBackend() = default;

absl::Status ShardBackend::SetEngine(std::unique_ptr<SearchEngine> engine) {
  absl::StatusOr<EngineResult> warm_up = engine->Search(WarmUpQuery(engine->info()));
  if (!warm_up.ok()) {
    return absl::Status(warm_up.status().code(),
                        absl::StrCat("warm-up query failed: ", warm_up.status().message()));
  }
  auto serving = std::make_shared<Serving>();
  serving->batcher = std::make_unique<Batcher>(engine.get(), options_, metrics_);
  serving->engine = std::move(engine);
  absl::MutexLock lock(&mu_);
  if (serving_ != nullptr) return absl::FailedPreconditionError("engine already set");
  serving_ = std::move(serving);
  return absl::OkStatus();
}

std::shared_ptr<const ShardBackend::Serving> ShardBackend::serving() const {
  absl::MutexLock lock(&mu_);
  return serving_;
}

absl::StatusOr<IndexShape> ShardBackend::Shape() const {
  std::shared_ptr<const Serving> serving = this->serving();
  if (serving == nullptr) return Loading(shard_id_);
  return serving->engine->info().shape();
}

absl::StatusOr<v1::InfoResponse> ShardBackend::Info() const {
  std::shared_ptr<const Serving> serving = this->serving();
  if (serving == nullptr) return Loading(shard_id_);
  const EngineInfo& info = serving->engine->info();
  v1::InfoResponse response;
  response.set_version(KNNSERVE_VERSION);
  response.set_dim(info.dim);
  response.set_metric(MetricToProto(info.metric));
  response.set_factory(info.factory);
  response.set_total_vectors(info.total_vectors);
  response.set_num_sentences(info.num_sentences);
  response.set_supports_subset(info.num_sentences > 0);
  response.set_subset_only(info.subset_only);
  v1::ShardInfo* shard = response.add_shards();
  shard->set_shard_id(shard_id_);
  shard->set_id_begin(info.id_begin);
  shard->set_id_end(info.id_end);
  shard->set_sentence_begin(info.sentence_begin);
  shard->set_sentence_end(info.sentence_end);
  shard->set_subset_only(info.subset_only);
  return response;
}

void ShardBackend::Search(SearchCall call, SearchDone done) {
  std::shared_ptr<const Serving> serving = this->serving();
  if (serving == nullptr) {
    done(Loading(shard_id_));
    return;
  }
  const bool subset = call.query.is_subset();
  const EngineInfo& info = serving->engine->info();
  const int64_t slice_vectors = info.id_end - info.id_begin;
  // The callback must not own `serving`: the last owner would join the batcher's workers from
  // one of them.
  serving->batcher->Submit(std::move(call), [subset, slice_vectors, done = std::move(done)](
                                                absl::StatusOr<EngineResult> result) {
    if (!result.ok()) {
      done(result.status());
      return;
    }
    done(ToAnswer(*std::move(result), subset, slice_vectors));
  });
}

}  // namespace knnserve
