#include "client/knn/knn_processor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace knnserve::knn {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// The log-probability of a token both distributions give zero (λ = 1, no neighbour votes): a
// finite floor, so that decoding constraints (EOS forced at the length limit) keep a choice.
constexpr float kLogZero = -1e9f;

double LogAddExp(double a, double b) {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  const double m = std::max(a, b);
  return m + std::log1p(std::exp(-std::abs(a - b)));
}

// One Search per at most `max_rows` query rows (batch x beam may exceed what a server accepts),
// in order; the answers concatenated.
absl::StatusOr<Neighbors> SearchInPieces(RetrievalSession& session, MatrixView<const float> queries,
                                         const std::vector<int32_t>& row_group,
                                         const SearchParams& params, int64_t max_rows) {
  if (queries.rows <= max_rows) return session.Search(queries, row_group, params);
  Neighbors all;
  all.k = params.k;
  for (int64_t begin = 0; begin < queries.rows; begin += max_rows) {
    const int64_t rows = std::min(max_rows, queries.rows - begin);
    std::vector<int32_t> groups;
    if (!row_group.empty()) {
      groups.assign(row_group.begin() + begin, row_group.begin() + begin + rows);
    }
    ASSIGN_OR_RETURN(Neighbors part,
                     session.Search({queries.row(begin), rows, queries.cols}, groups, params));
    all.rows += part.rows;
    all.distances.insert(all.distances.end(), part.distances.begin(), part.distances.end());
    all.ids.insert(all.ids.end(), part.ids.begin(), part.ids.end());
    all.values.insert(all.values.end(), part.values.begin(), part.values.end());
  }
  return all;
}

// [rows, d] float32, contiguous, on the CPU: the bytes a query matrix views.
torch::Tensor QueryTensor(const torch::Tensor& features) {
  return features.to(torch::kCPU, torch::kFloat).contiguous();
}

// REQUIRES: `query` is a QueryTensor, which must outlive the view.
MatrixView<const float> QueryView(const torch::Tensor& query) {
  return {query.data_ptr<float>(), query.size(0), query.size(1)};
}

}  // namespace

absl::Status ValidateKnnOptions(const KnnOptions& options) {
  if (options.k < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--knn-topk must be >= 1, got ", options.k));
  }
  // Bounded away from 0 so that -d/τ stays finite for every float distance (a τ of 1e-320
  // overflowed the scores to -inf, and their differences to NaN).
  if (!(options.temperature >= kMinTemperature && options.temperature <= kMaxTemperature)) {
    return absl::InvalidArgumentError(absl::StrCat("--knn-temperature must be in [",
                                                   kMinTemperature, ", ", kMaxTemperature,
                                                   "], got ", options.temperature));
  }
  if (!(options.weight >= 0 && options.weight <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--knn-weight must be in [0, 1], got ", options.weight));
  }
  if (options.nprobe < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--knn-nprobe must be >= 0, got ", options.nprobe));
  }
  if (!(options.threshold >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--knn-threshold must be >= 0 (0: off), got ", options.threshold));
  }
  return absl::OkStatus();
}

absl::Status InterpolateKnn(const Neighbors& neighbors, Metric metric, const KnnOptions& options,
                            torch::Tensor& log_probs) {
  std::vector<int64_t> every_row(log_probs.dim() == 2 ? log_probs.size(0) : 0);
  std::iota(every_row.begin(), every_row.end(), 0);
  return InterpolateKnn(neighbors, every_row, metric, options, log_probs);
}

absl::Status InterpolateKnn(const Neighbors& neighbors, absl::Span<const int64_t> rows,
                            Metric metric, const KnnOptions& options, torch::Tensor& log_probs) {
  if (log_probs.dim() != 2 || neighbors.rows != static_cast<int64_t>(rows.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("interpolation: ", neighbors.rows, " neighbour rows for ", rows.size(),
                     " rows of log-probabilities of ", log_probs.dim(), " dims"));
  }
  for (const int64_t r : rows) {
    if (r < 0 || r >= log_probs.size(0)) {
      return absl::InvalidArgumentError(absl::StrCat("interpolation: row ", r, " of ",
                                                     log_probs.size(0), " log-probability rows"));
    }
  }
  if (!neighbors.has_values()) {
    return absl::InvalidArgumentError("interpolation: the neighbours carry no values");
  }
  if (options.weight == 0) return absl::OkStatus();
  const int64_t vocab = log_probs.size(1);
  // log_probs itself when it already is CPU float32 and contiguous: a fresh [rows, V] tensor per
  // step cost page faults and a second pass over the memory.
  torch::Tensor work = log_probs.to(torch::kCPU, torch::kFloat).contiguous();
  const double log_weight = std::log(options.weight);
  const double log_rest = options.weight < 1 ? std::log1p(-options.weight) : kNegInf;
  float* data = work.data_ptr<float>();
  std::vector<std::pair<int32_t, double>> votes;  // (token, score = -d/τ, then its exp)
  std::vector<std::pair<int32_t, float>> voted;   // (token, interpolated log-probability)
  for (int64_t n = 0; n < neighbors.rows; ++n) {
    votes.clear();
    for (int j = 0; j < neighbors.k; ++j) {
      const int64_t i = n * neighbors.k + j;
      const int32_t token = neighbors.values[i];
      const double d = neighbors.distances[i];
      if (neighbors.ids[i] < 0 || token < 0 || token >= vocab || !std::isfinite(d)) continue;
      if (options.threshold > 0 && metric == Metric::kL2 && d > options.threshold) continue;
      votes.emplace_back(token, (metric == Metric::kL2 ? -d : d) / options.temperature);
    }
    if (votes.empty()) continue;  // nothing retrieved for this row: p_MT alone
    float* row = data + rows[n] * vocab;
    // The voted tokens are combined in log space (log p_kNN only where p_kNN > 0): the votes'
    // exponentials are shifted by the largest score, so one exp per vote and one log per voted
    // token give log p_kNN (a chain of log-add-exps cost an exp and a log1p per vote, twice).
    double top = votes[0].second;
    for (const auto& [token, score] : votes) top = std::max(top, score);
    double z = 0.0;  // >= 1: the top vote contributes exp(0)
    for (auto& [token, score] : votes) {
      score = std::exp(score - top);
      z += score;
    }
    std::sort(votes.begin(), votes.end());
    voted.clear();
    for (size_t a = 0; a < votes.size();) {
      double mass = 0.0;
      size_t b = a;
      for (; b < votes.size() && votes[b].first == votes[a].first; ++b) mass += votes[b].second;
      const int32_t token = votes[a].first;
      // log(0) = -inf for a mass below double's range: LogAddExp then keeps the model's term.
      const double knn_term = log_weight + std::log(mass / z);
      const double mt_term = log_rest + static_cast<double>(row[token]);
      voted.emplace_back(token,
                         std::max(kLogZero, static_cast<float>(LogAddExp(knn_term, mt_term))));
      a = b;
    }
    // Every other token keeps (1 - λ) p_MT.
    if (options.weight < 1) {
      const float rest = static_cast<float>(log_rest);
      for (int64_t c = 0; c < vocab; ++c) row[c] += rest;
    } else {
      std::fill(row, row + vocab, kLogZero);
    }
    for (const auto& [token, value] : voted) row[token] = value;
  }
  if (!work.is_same(log_probs)) log_probs = work.to(log_probs.device());
  return absl::OkStatus();
}

void KnnStats::Add(const KnnStats& other) {
  batches += other.batches;
  steps += other.steps;
  query_rows += other.query_rows;
  subset_sentences += other.subset_sentences;
  select_time += other.select_time;
  retrieval_time += other.retrieval_time;
  search_time += other.search_time;
  interpolate_time += other.interpolate_time;
}

struct KnnLogitsProcessor::PendingStep {
  std::vector<int64_t> rows;  // the step's live rows, which the query's rows answer for
  torch::Tensor features;     // a QueryTensor of those rows
  std::vector<int32_t> row_group;
  // Written by the worker; read after WorkerThread::Wait.
  absl::StatusOr<Neighbors> neighbors;
  absl::Duration search_time;
};

KnnLogitsProcessor::KnnLogitsProcessor(Retriever* retriever, const KnnOptions& options,
                                       SubsetSelector* selector)
    : retriever_(retriever),
      options_(options),
      selector_(selector),
      worker_(options.background_search ? WorkerPriority::kIdle : WorkerPriority::kNormal) {}

KnnLogitsProcessor::~KnnLogitsProcessor() = default;

SearchParams KnnLogitsProcessor::StepParams() const {
  SearchParams params;
  params.k = options_.k;
  params.nprobe = options_.nprobe;
  return params;
}

void KnnLogitsProcessor::DiscardPendingStep() {
  worker_.Wait();
  pending_.reset();
}

absl::StatusOr<std::unique_ptr<KnnLogitsProcessor>> KnnLogitsProcessor::Create(
    Retriever* retriever, const KnnOptions& options, SubsetSelector* selector) {
  RETURN_IF_ERROR(ValidateKnnOptions(options));
  if (selector != nullptr && !retriever->info().supports_subset) {
    return absl::FailedPreconditionError(
        "subset kNN-MT needs an index with subset codes (built with values and a PQ)");
  }
  if (options.threshold > 0 && retriever->info().metric != Metric::kL2) {
    return absl::InvalidArgumentError(
        "--knn-threshold drops neighbours farther than a squared L2 distance, but this index "
        "ranks by inner product: leave it at 0");
  }
  if (selector == nullptr && retriever->info().subset_only) {
    return absl::FailedPreconditionError(
        "kNN-MT searches the whole datastore, but its shards serve subset searches only "
        "(knnserve-shard --subset-only): use --mode subset-knn, or shards with their faiss "
        "index");
  }
  return absl::WrapUnique(new KnnLogitsProcessor(retriever, options, selector));
}

// The selection reads the whole sentence index for each batch (a Flat index of the demo's 57,765
// sentences is 59 MB: 6 ms for one source sentence); on the decoding thread it was 6% of subset
// kNN-MT's time at batch 1. On the worker, before the batch's first search (the worker runs its
// jobs in order), it runs while the model computes the other batch's steps.
absl::Status KnnLogitsProcessor::BeginBatch(const torch::Tensor& src_tokens,
                                            const model::EncoderOutput& encoder_out) {
  DiscardPendingStep();
  CollectSetup().IgnoreError();  // a failed setup was returned by the previous batch's Process
  batch_begun_ = true;
  ++stats_.batches;
  worker_.Post([this, src_tokens, encoder_out] { SetUpBatch(src_tokens, encoder_out); });
  return absl::OkStatus();
}

void KnnLogitsProcessor::SetUpBatch(const torch::Tensor& src_tokens,
                                    const model::EncoderOutput& encoder_out) {
  session_.reset();  // one stream per batch: the previous batch's session ends here
  BatchSetup setup{.collected = false};
  setup.status = [&]() -> absl::Status {
    SubsetGroups groups;
    if (selector_ != nullptr) {
      const absl::Time start = absl::Now();
      ASSIGN_OR_RETURN(groups, selector_->Select(src_tokens, encoder_out));
      setup.select_time = absl::Now() - start;
      if (static_cast<int64_t>(groups.size()) != src_tokens.size(0)) {
        return absl::InternalError(absl::StrCat("subset selection returned ", groups.size(),
                                                " groups for ", src_tokens.size(0), " sentences"));
      }
      for (const auto& group : groups) setup.sentences += group.size();
    }
    ASSIGN_OR_RETURN(session_, retriever_->StartSession(std::move(groups)));
    return absl::OkStatus();
  }();
  setup_ = std::move(setup);
}

absl::Status KnnLogitsProcessor::CollectSetup() {
  if (!setup_.collected) {
    stats_.select_time += setup_.select_time;
    stats_.subset_sentences += setup_.sentences;
    setup_.collected = true;
  }
  return setup_.status;
}

absl::StatusOr<std::unique_ptr<KnnLogitsProcessor::PendingStep>> KnnLogitsProcessor::PrepareStep(
    const decode::StepContext& context) const {
  if (!batch_begun_) return absl::FailedPreconditionError("kNN-MT step before BeginBatch");
  for (const int64_t r : context.live_rows) {
    if (r < 0 || r >= context.features.size(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("kNN-MT step: live row ", r, " of ", context.features.size(0), " rows"));
    }
  }
  auto step = std::make_unique<PendingStep>();
  step->rows = context.live_rows;
  // Dead rows are not searched: at beam search's first step they are four fifths of a beam of
  // five, the same decoder state as the sentence's live row.
  const bool every_row = static_cast<int64_t>(step->rows.size()) == context.features.size(0);
  step->features = QueryTensor(
      every_row ? context.features
                : context.features.index_select(
                      0, torch::tensor(step->rows, torch::kLong).to(context.features.device())));
  if (selector_ != nullptr) {  // the session declared one group per batch sentence
    const torch::Tensor sentence = context.sentence.to(torch::kCPU, torch::kLong).contiguous();
    const int64_t* s = sentence.data_ptr<int64_t>();
    step->row_group.reserve(step->rows.size());
    for (const int64_t r : step->rows) step->row_group.push_back(static_cast<int32_t>(s[r]));
  }
  return step;
}

// Touches no tensor: it runs on the worker while the decoder computes with the features (which
// it only reads).
void KnnLogitsProcessor::RunSearch(PendingStep& step) const {
  if (session_ == nullptr) {  // the batch's setup failed: Process returns its error
    step.neighbors = absl::FailedPreconditionError("the batch's retrieval session did not start");
    return;
  }
  if (step.rows.empty()) {  // nothing to search: every row keeps p_MT
    step.neighbors = Neighbors{.k = StepParams().k};
    return;
  }
  const absl::Time start = absl::Now();
  step.neighbors = SearchInPieces(*session_, QueryView(step.features), step.row_group, StepParams(),
                                  retriever_->info().max_rows);
  step.search_time = absl::Now() - start;
}

absl::Status KnnLogitsProcessor::BeginStep(const decode::StepContext& context) {
  if (!options_.overlap_search) return absl::OkStatus();
  // A step that failed before Process left its search behind; the batch's setup may still run
  // (the search is queued after it).
  if (pending_ != nullptr) DiscardPendingStep();
  ASSIGN_OR_RETURN(pending_, PrepareStep(context));
  worker_.Post([this, step = pending_.get()] { RunSearch(*step); });
  return absl::OkStatus();
}

absl::Status KnnLogitsProcessor::Process(decode::StepContext& context) {
  const absl::Time start = absl::Now();
  std::unique_ptr<PendingStep> step;
  worker_.Wait();  // this step's search, or at least the batch's setup
  RETURN_IF_ERROR(CollectSetup());
  if (pending_ != nullptr) {
    step = std::move(pending_);
  } else {
    ASSIGN_OR_RETURN(step, PrepareStep(context));
    RunSearch(*step);
  }
  const absl::Time searched = absl::Now();
  stats_.retrieval_time += searched - start;
  stats_.search_time += step->search_time;
  RETURN_IF_ERROR(step->neighbors.status());
  if (!step->rows.empty()) {
    RETURN_IF_ERROR(InterpolateKnn(*step->neighbors, step->rows, retriever_->info().metric,
                                   options_, context.log_probs));
  }
  stats_.interpolate_time += absl::Now() - searched;
  ++stats_.steps;
  stats_.query_rows += step->features.size(0);
  return absl::OkStatus();
}

absl::StatusOr<Neighbors> KnnLogitsProcessor::SearchOnce(const torch::Tensor& features) {
  const torch::Tensor f = QueryTensor(features);
  ASSIGN_OR_RETURN(std::unique_ptr<RetrievalSession> session, retriever_->StartSession({}));
  return SearchInPieces(*session, QueryView(f), {}, StepParams(), retriever_->info().max_rows);
}

}  // namespace knnserve::knn
