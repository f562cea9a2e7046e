#include "client/knn/local_retriever.h"

#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/index/index_engine.h"
#include "common/status_macros.h"
#include "common/wire.h"

namespace knnserve::knn {
namespace {

// Session over an in-process engine. Every step is validated exactly as a server validates it
// (ParseSearchRequest), so the embedded mode accepts and refuses what the service does.
class LocalSession : public RetrievalSession {
 public:
  LocalSession(const SearchEngine* engine, const RequestLimits* limits,
               std::shared_ptr<const SubsetGroups> groups)
      : engine_(engine), limits_(limits), groups_(std::move(groups)) {}

  absl::StatusOr<Neighbors> Search(MatrixView<const float> queries,
                                   const std::vector<int32_t>& row_group,
                                   const SearchParams& params) override {
    v1::SearchRequest request;
    EncodeSearchRequest(queries, v1::DTYPE_FP32, params, &request);
    request.mutable_row_group()->Assign(row_group.begin(), row_group.end());
    ASSIGN_OR_RETURN(SearchQuery query,
                     ParseSearchRequest(request, engine_->info().shape(), *limits_, {groups_}));
    ASSIGN_OR_RETURN(EngineResult result, engine_->Search(query));
    return std::move(result.neighbors);
  }

 private:
  const SearchEngine* const engine_;
  const RequestLimits* const limits_;
  const std::shared_ptr<const SubsetGroups> groups_;
};

}  // namespace

LocalRetriever::LocalRetriever(std::unique_ptr<SearchEngine> engine, RetrieverInfo info)
    : engine_(std::move(engine)), info_(info) {}

absl::StatusOr<std::unique_ptr<LocalRetriever>> LocalRetriever::Create(const std::string& index_dir,
                                                                       int threads,
                                                                       bool full_search) {
  IndexEngineOptions options;
  options.threads = threads;
  options.full_search = full_search;
  ASSIGN_OR_RETURN(std::unique_ptr<SearchEngine> engine, CreateLocalEngine(index_dir, options));
  return Create(std::move(engine));
}

absl::StatusOr<std::unique_ptr<LocalRetriever>> LocalRetriever::Create(
    std::unique_ptr<SearchEngine> engine) {
  const EngineInfo& e = engine->info();
  if (!e.has_values) {
    return absl::FailedPreconditionError(
        "the index carries no datastore values (token ids): kNN-MT needs them; rebuild the "
        "index with values");
  }
  if (e.id_begin != 0 || e.id_end != e.total_vectors) {
    return absl::InvalidArgumentError(
        absl::StrCat("the engine holds ids [", e.id_begin, ", ", e.id_end, ") of ", e.total_vectors,
                     ": the embedded mode needs the whole datastore (all shards)"));
  }
  RetrieverInfo info;
  info.dim = e.dim;
  info.metric = e.metric;
  info.total_vectors = e.total_vectors;
  info.num_sentences = e.num_sentences;
  info.supports_subset = e.num_sentences > 0;
  info.subset_only = e.subset_only;
  return absl::WrapUnique(new LocalRetriever(std::move(engine), info));
}

absl::StatusOr<std::unique_ptr<RetrievalSession>> LocalRetriever::StartSession(
    SubsetGroups groups) {
  std::shared_ptr<const SubsetGroups> parsed;
  if (!groups.empty()) {
    google::protobuf::RepeatedPtrField<v1::SubsetGroup> proto;
    for (const std::vector<int64_t>& ids : groups) {
      proto.Add()->mutable_sentence_ids()->Assign(ids.begin(), ids.end());
    }
    ASSIGN_OR_RETURN(SubsetGroups valid,
                     ParseSubsetGroups(proto, engine_->info().shape(), limits_));
    parsed = std::make_shared<const SubsetGroups>(std::move(valid));
  }
  return std::make_unique<LocalSession>(engine_.get(), &limits_, std::move(parsed));
}

}  // namespace knnserve::knn
