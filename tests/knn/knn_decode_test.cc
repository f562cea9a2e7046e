// kNN-MT wired into beam search end to end, on a tiny random model and a datastore built from
// the test pairs themselves: embedded and remote (real shard and router servers on 127.0.0.1).
#include <atomic>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "client/decode/search.h"
#include "client/knn/knn_processor.h"
#include "client/knn/local_retriever.h"
#include "client/knn/remote_retriever.h"
#include "client/knn/subset_selector.h"
#include "common/index/index_engine.h"
#include "common/status_macros.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/knn/knn_test_util.h"
#include "tests/server/test_cluster.h"

namespace knnserve::testing {
namespace {

using ::testing::ElementsAreArray;

// Best hypotheses of every batch, batch after batch.
std::vector<std::vector<int>> DecodeBatches(model::TransformerModel& model,
                                            const std::vector<torch::Tensor>& batches,
                                            decode::LogitsProcessor* first,
                                            decode::LogitsProcessor* second, int beam = 5) {
  decode::SearchOptions options;
  options.beam_size = beam;
  options.processor = first;
  options.second_processor = second;
  absl::StatusOr<std::vector<std::vector<std::vector<decode::Hypothesis>>>> nbest =
      decode::BeamSearchBatches(model, batches, options);
  EXPECT_OK(nbest.status());
  std::vector<std::vector<int>> out;
  if (!nbest.ok()) return out;
  for (const auto& batch : *nbest) {
    for (const auto& n : batch) out.push_back(n.empty() ? std::vector<int>() : n[0].tokens);
  }
  return out;
}

std::vector<std::vector<int>> Decode(model::TransformerModel& model, const torch::Tensor& src,
                                     decode::LogitsProcessor* processor, int beam) {
  if (beam > 1) return DecodeBatches(model, {src}, processor, nullptr, beam);
  decode::SearchOptions options;
  options.beam_size = beam;
  options.processor = processor;
  absl::StatusOr<std::vector<decode::Hypothesis>> hyps = decode::GreedySearch(model, src, options);
  EXPECT_OK(hyps.status());
  std::vector<std::vector<int>> out;
  if (!hyps.ok()) return out;
  for (const auto& h : *hyps) out.push_back(h.tokens);
  return out;
}

std::vector<std::vector<int>> References(const std::vector<TokenPair>& pairs) {
  std::vector<std::vector<int>> refs;
  for (const TokenPair& p : pairs) refs.emplace_back(p.target.begin(), p.target.end());
  return refs;
}

std::unique_ptr<knn::KnnLogitsProcessor> MakeProcessor(knn::Retriever* retriever,
                                                       knn::KnnOptions options,
                                                       knn::SubsetSelector* selector = nullptr) {
  absl::StatusOr<std::unique_ptr<knn::KnnLogitsProcessor>> p =
      knn::KnnLogitsProcessor::Create(retriever, options, selector);
  EXPECT_OK(p.status());
  return *std::move(p);
}

class KnnDecodeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new model::TransformerModel(MakeTinyModel(7));
    pairs_ = new std::vector<TokenPair>(MakePairs(60, 11));
    flat_ = new TestDatastore(BuildTestDatastore(*model_, *pairs_, "Flat", 2, "flat"));
    pq_ = new TestDatastore(BuildTestDatastore(*model_, *pairs_, "PQ8np", 2, "pq"));
  }
  static void TearDownTestSuite() {
    delete pq_;
    delete flat_;
    delete pairs_;
    delete model_;
  }

  static std::unique_ptr<knn::LocalRetriever> Local(const TestDatastore& ds) {
    absl::StatusOr<std::unique_ptr<knn::LocalRetriever>> r =
        knn::LocalRetriever::Create(ds.index_dir, 1);
    EXPECT_OK(r.status());
    return *std::move(r);
  }

  static model::TransformerModel* model_;
  static std::vector<TokenPair>* pairs_;
  static TestDatastore* flat_;
  static TestDatastore* pq_;
};

model::TransformerModel* KnnDecodeTest::model_ = nullptr;
std::vector<TokenPair>* KnnDecodeTest::pairs_ = nullptr;
TestDatastore* KnnDecodeTest::flat_ = nullptr;
TestDatastore* KnnDecodeTest::pq_ = nullptr;

TEST_F(KnnDecodeTest, WeightZeroReproducesBaseTranslationsExactly) {
  const torch::Tensor src = SourceBatch(*pairs_);
  auto retriever = Local(*flat_);
  knn::KnnOptions options;
  options.weight = 0;
  options.k = 8;
  for (int beam : {1, 5}) {
    auto processor = MakeProcessor(retriever.get(), options);
    EXPECT_EQ(Decode(*model_, src, processor.get(), beam), Decode(*model_, src, nullptr, beam))
        << "beam " << beam;
    EXPECT_GT(processor->stats().steps, 0);
  }
}

TEST_F(KnnDecodeTest, DatastoreOfTheTestPairsReproducesTheReferences) {
  const torch::Tensor src = SourceBatch(*pairs_);
  const auto refs = References(*pairs_);
  // The random model alone is far from the references; retrieval with λ = 1, k = 1 copies the
  // value of the exact key of every reference prefix, so the output is the reference.
  EXPECT_NE(Decode(*model_, src, nullptr, 1), refs);
  auto retriever = Local(*flat_);
  knn::KnnOptions options;
  options.weight = 1;
  options.k = 1;
  for (int beam : {1, 5}) {
    auto processor = MakeProcessor(retriever.get(), options);
    EXPECT_EQ(Decode(*model_, src, processor.get(), beam), refs) << "beam " << beam;
  }
}

TEST_F(KnnDecodeTest, SubsetOverAllSentencesEqualsFullSearch) {
  // Full search of an exhaustive PQ index (PQ8np: 4-dim sub-quantizers, 256 centroids for ~400
  // keys: nearly exact) and subset ADC over every sentence scan the same codes with the same
  // tables: the same neighbours, hence the same translations.
  const torch::Tensor src = SourceBatch(*pairs_);
  auto retriever = Local(*pq_);
  ASSERT_TRUE(retriever->info().supports_subset);
  ASSERT_OK_AND_ASSIGN(auto selector, knn::SentenceIndexSelector::Load(pq_->sentence_index_dir,
                                                                       pq_->num_sentences, 1));
  knn::KnnOptions options;
  options.weight = 0.7;
  options.k = 4;
  options.temperature = 5;
  auto full = MakeProcessor(retriever.get(), options);
  auto subset = MakeProcessor(retriever.get(), options, selector.get());
  const auto full_out = Decode(*model_, src, full.get(), 5);
  EXPECT_EQ(Decode(*model_, src, subset.get(), 5), full_out);
  EXPECT_EQ(subset->stats().subset_sentences, pq_->num_sentences * pq_->num_sentences);
  EXPECT_NE(full_out, Decode(*model_, src, nullptr, 5));  // retrieval changed something
}

TEST_F(KnnDecodeTest, SubsetOfTheNearestSentenceFindsTheReference) {
  // Each source's nearest sentence embedding (AvgEnc) is its own datastore sentence, and a
  // subset of that one sentence reproduces the reference with λ = 1, k = 1 — up to the PQ
  // approximation, which can swap two near-identical keys of one sentence (a repeated token).
  const torch::Tensor src = SourceBatch(*pairs_);
  auto retriever = Local(*pq_);
  ASSERT_OK_AND_ASSIGN(auto selector,
                       knn::SentenceIndexSelector::Load(pq_->sentence_index_dir, 1, 1));
  {
    torch::NoGradGuard no_grad;
    ASSERT_OK_AND_ASSIGN(SubsetGroups groups, selector->Select(src, (*model_)->Encode(src)));
    for (size_t i = 0; i < groups.size(); ++i) {
      EXPECT_THAT(groups[i], ElementsAreArray({static_cast<int64_t>(i)})) << "sentence " << i;
    }
  }
  knn::KnnOptions options;
  options.weight = 1;
  options.k = 1;
  auto processor = MakeProcessor(retriever.get(), options, selector.get());
  const auto out = Decode(*model_, src, processor.get(), 1);
  const auto refs = References(*pairs_);
  int same = 0;
  for (size_t i = 0; i < refs.size(); ++i) same += out[i] == refs[i];
  EXPECT_GE(same, static_cast<int>(refs.size()) * 9 / 10);
}

// Two shards x `replicas` shard servers over an index directory, and a router in front.
struct Cluster {
  // router_options: FastRouterOptions() unless given.
  Cluster(const TestDatastore& ds, int replicas,
          std::optional<RouterOptions> router_options = std::nullopt) {
    for (int r = 0; r < replicas; ++r) {
      for (int s = 0; s < 2; ++s) {
        absl::StatusOr<std::unique_ptr<SearchEngine>> engine = CreateEngine(ds.index_dir, s, {});
        EXPECT_OK(engine.status());
        shards.push_back(std::make_unique<TestShard>(s, *std::move(engine)));
        map[s].push_back(shards.back()->address());
      }
    }
    router = std::make_unique<TestRouter>(map, router_options.value_or(FastRouterOptions()));
  }

  std::unique_ptr<knn::RemoteRetriever> Retriever() const {
    knn::RemoteRetrieverOptions options;
    options.address = router->address();
    absl::StatusOr<std::unique_ptr<knn::RemoteRetriever>> r = knn::RemoteRetriever::Create(options);
    EXPECT_OK(r.status());
    return *std::move(r);
  }

  std::vector<std::unique_ptr<TestShard>> shards;  // shard s, replica r at r * 2 + s
  ShardMap map;
  std::unique_ptr<TestRouter> router;
};

// 40 sentences x beam 5 = 200 query rows per step: within the 256 the test servers accept
// (TestLimits), so a step is one message unless a test lowers the limit.
torch::Tensor RemoteBatch(const std::vector<TokenPair>& pairs) {
  return SourceBatch(std::vector<TokenPair>(pairs.begin(), pairs.begin() + 40));
}

// A strong kNN-MT interpolation, so that a retrieval difference shows in the translations.
knn::KnnOptions RemoteTestOptions() {
  knn::KnnOptions options;
  options.weight = 0.6;
  options.k = 6;
  options.temperature = 3;
  return options;
}

TEST_F(KnnDecodeTest, RemoteAndEmbeddedTranslationsAreIdentical) {
  const torch::Tensor src = RemoteBatch(*pairs_);
  const knn::KnnOptions options = RemoteTestOptions();
  for (const TestDatastore* ds : {flat_, pq_}) {
    Cluster cluster(*ds, 1);
    auto remote = cluster.Retriever();
    auto local = Local(*ds);
    EXPECT_EQ(remote->info().total_vectors, local->info().total_vectors);
    auto remote_processor = MakeProcessor(remote.get(), options);
    auto local_processor = MakeProcessor(local.get(), options);
    const auto expected = Decode(*model_, src, local_processor.get(), 5);
    EXPECT_EQ(Decode(*model_, src, remote_processor.get(), 5), expected) << ds->index_dir;
    EXPECT_EQ(remote_processor->stats().steps, local_processor->stats().steps);
  }
  // Subset kNN-MT through the router: groups declared once per batch on the stream.
  Cluster cluster(*pq_, 1);
  auto remote = cluster.Retriever();
  auto local = Local(*pq_);
  ASSERT_OK_AND_ASSIGN(auto selector,
                       knn::SentenceIndexSelector::Load(pq_->sentence_index_dir, 8, 1));
  auto remote_processor = MakeProcessor(remote.get(), options, selector.get());
  auto local_processor = MakeProcessor(local.get(), options, selector.get());
  EXPECT_EQ(Decode(*model_, src, remote_processor.get(), 5),
            Decode(*model_, src, local_processor.get(), 5));
}

// The test pairs' sources in batches of 16 (the last one shorter), as TranslateTexts cuts them.
std::vector<torch::Tensor> SourceBatches(const std::vector<TokenPair>& pairs) {
  std::vector<torch::Tensor> batches;
  for (size_t begin = 0; begin < pairs.size(); begin += 16) {
    const size_t end = std::min(pairs.size(), begin + 16);
    batches.push_back(
        SourceBatch(std::vector<TokenPair>(pairs.begin() + begin, pairs.begin() + end)));
  }
  return batches;
}

// Two batches in flight, each with its own processor (session), their steps alternating:
// embedded full and subset kNN-MT and subset kNN-MT through the router translate exactly as
// one batch at a time does.
TEST_F(KnnDecodeTest, InterleavedBatchesTranslateAsOneBatchAtATime) {
  const std::vector<torch::Tensor> batches = SourceBatches(*pairs_);
  ASSERT_EQ(batches.size(), 4u);
  const knn::KnnOptions options = RemoteTestOptions();
  ASSERT_OK_AND_ASSIGN(auto selector,
                       knn::SentenceIndexSelector::Load(pq_->sentence_index_dir, 8, 1));
  auto local_flat = Local(*flat_);
  auto local_pq = Local(*pq_);
  Cluster cluster(*pq_, 1);
  auto remote_pq = cluster.Retriever();
  struct Case {
    const char* name;
    knn::Retriever* retriever;
    knn::SubsetSelector* selector;
  };
  for (const Case& c : {Case{"embedded full", local_flat.get(), nullptr},
                        Case{"embedded subset", local_pq.get(), selector.get()},
                        Case{"remote subset", remote_pq.get(), selector.get()}}) {
    auto alone = MakeProcessor(c.retriever, options, c.selector);
    const auto expected = DecodeBatches(*model_, batches, alone.get(), nullptr);
    auto first = MakeProcessor(c.retriever, options, c.selector);
    auto second = MakeProcessor(c.retriever, options, c.selector);
    EXPECT_EQ(DecodeBatches(*model_, batches, first.get(), second.get()), expected) << c.name;
    EXPECT_EQ(first->stats().batches + second->stats().batches, 4) << c.name;
    EXPECT_GE(second->stats().batches, 1) << c.name;
    EXPECT_EQ(first->stats().steps + second->stats().steps, alone->stats().steps) << c.name;
  }
}

// batch x beam query rows per step above the router's max_rows: the processor sends each step
// in pieces and the translation does not change.
TEST_F(KnnDecodeTest, StepsLargerThanTheRouterAcceptsAreSentInPieces) {
  const torch::Tensor src = RemoteBatch(*pairs_);
  const knn::KnnOptions options = RemoteTestOptions();
  RouterOptions router_options = FastRouterOptions();
  router_options.limits.max_rows = 3;  // fewer than the beam alone
  Cluster cluster(*flat_, 1, router_options);
  auto remote = cluster.Retriever();
  auto local = Local(*flat_);
  auto remote_processor = MakeProcessor(remote.get(), options);
  auto local_processor = MakeProcessor(local.get(), options);
  EXPECT_EQ(Decode(*model_, src, remote_processor.get(), 5),
            Decode(*model_, src, local_processor.get(), 5));
  EXPECT_EQ(remote_processor->stats().steps, local_processor->stats().steps);
}

// Kills a replica once the decoding has run `at_step` steps, then lets the step go on.
class KillingProcessor : public decode::LogitsProcessor {
 public:
  KillingProcessor(decode::LogitsProcessor* inner, TestShard* victim, int at_step)
      : inner_(inner), victim_(victim), at_step_(at_step) {}
  absl::Status BeginBatch(const torch::Tensor& src,
                          const model::EncoderOutput& encoder_out) override {
    return inner_->BeginBatch(src, encoder_out);
  }
  absl::Status Process(decode::StepContext& context) override {
    if (steps_++ == at_step_) victim_->Kill();
    return inner_->Process(context);
  }

 private:
  decode::LogitsProcessor* const inner_;
  TestShard* const victim_;
  const int at_step_;
  int steps_ = 0;
};

TEST_F(KnnDecodeTest, TranslationSurvivesAKilledReplica) {
  const torch::Tensor src = RemoteBatch(*pairs_);
  const knn::KnnOptions options = RemoteTestOptions();
  auto local = Local(*flat_);
  auto local_processor = MakeProcessor(local.get(), options);
  const auto expected = Decode(*model_, src, local_processor.get(), 5);
  Cluster cluster(*flat_, 2);
  auto remote = cluster.Retriever();
  auto remote_processor = MakeProcessor(remote.get(), options);
  KillingProcessor killing(remote_processor.get(), cluster.shards[1].get(), 3);
  EXPECT_EQ(Decode(*model_, src, &killing, 5), expected);
}

// Wraps a retriever: every Search reports that it started, then waits until the test releases
// it (or 30 s pass, then it fails), so a test can see a search running while its caller is free.
class GatedRetriever : public knn::Retriever {
 public:
  explicit GatedRetriever(knn::Retriever* inner) : inner_(inner) {}
  const knn::RetrieverInfo& info() const override { return inner_->info(); }
  absl::StatusOr<std::unique_ptr<knn::RetrievalSession>> StartSession(
      SubsetGroups groups) override {
    ASSIGN_OR_RETURN(auto session, inner_->StartSession(std::move(groups)));
    return std::make_unique<Session>(std::move(session), this);
  }
  absl::Notification started;
  absl::Notification release;

 private:
  class Session : public knn::RetrievalSession {
   public:
    Session(std::unique_ptr<knn::RetrievalSession> inner, GatedRetriever* gate)
        : inner_(std::move(inner)), gate_(gate) {}
    absl::StatusOr<Neighbors> Search(MatrixView<const float> queries,
                                     const std::vector<int32_t>& row_group,
                                     const SearchParams& params) override {
      gate_->started.Notify();
      if (!gate_->release.WaitForNotificationWithTimeout(absl::Seconds(30))) {
        return absl::DeadlineExceededError("the test never released the search");
      }
      return inner_->Search(queries, row_group, params);
    }

   private:
    std::unique_ptr<knn::RetrievalSession> inner_;
    GatedRetriever* gate_;
  };
  knn::Retriever* inner_;
};

// One decoding step's context for `rows` random queries: features and log-probabilities.
decode::StepContext RandomStep(int64_t rows, int64_t dim, int64_t vocab) {
  torch::manual_seed(5);
  decode::StepContext context;
  context.features = torch::randn({rows, dim});
  context.sentence = torch::zeros({rows}, torch::kLong);
  context.log_probs = torch::log_softmax(torch::randn({rows, vocab}), 1);
  context.live_rows.resize(rows);
  std::iota(context.live_rows.begin(), context.live_rows.end(), 0);
  return context;
}

TEST_F(KnnDecodeTest, OnlyLiveRowsAreSearchedAndDeadRowsKeepTheModel) {
  auto local = Local(*flat_);
  knn::KnnOptions options;
  options.k = 4;
  options.weight = 0.7;
  const int64_t vocab = (*model_)->config().tgt_vocab_size;
  const torch::Tensor src = SourceBatch(*pairs_);
  const model::EncoderOutput encoder_out = (*model_)->Encode(src);
  for (const bool overlap : {true, false}) {
    options.overlap_search = overlap;
    auto processor = MakeProcessor(local.get(), options);
    auto every_row = MakeProcessor(local.get(), options);
    ASSERT_OK(processor->BeginBatch(src, encoder_out));
    ASSERT_OK(every_row->BeginBatch(src, encoder_out));
    decode::StepContext step = RandomStep(6, local->info().dim, vocab);
    const torch::Tensor model_log_probs = step.log_probs.clone();
    decode::StepContext all = step;
    all.log_probs = step.log_probs.clone();
    step.live_rows = {0, 2, 5};
    ASSERT_OK(processor->BeginStep(step));
    ASSERT_OK(processor->Process(step));
    ASSERT_OK(every_row->BeginStep(all));
    ASSERT_OK(every_row->Process(all));
    EXPECT_EQ(processor->stats().query_rows, 3);
    // A live row as when every row is searched (up to the rounding of the distances, which
    // depends on the number of rows searched together); a dead row as the model gave it.
    for (int64_t r = 0; r < 6; ++r) {
      const bool live = r == 0 || r == 2 || r == 5;
      EXPECT_TRUE(live ? torch::allclose(step.log_probs[r], all.log_probs[r], 1e-5, 1e-5)
                       : torch::equal(step.log_probs[r], model_log_probs[r]))
          << "row " << r << (overlap ? " with" : " without") << " overlap";
      EXPECT_FALSE(torch::equal(all.log_probs[r], model_log_probs[r])) << "row " << r;
    }
  }
}

TEST_F(KnnDecodeTest, StepSearchRunsWhileTheModelComputesLogProbs) {
  auto local = Local(*flat_);
  GatedRetriever gated(local.get());
  knn::KnnOptions options;
  options.k = 4;
  auto processor = MakeProcessor(&gated, options);
  auto reference = MakeProcessor(local.get(), options);
  const int64_t vocab = (*model_)->config().tgt_vocab_size;
  const torch::Tensor src = SourceBatch(*pairs_);
  const model::EncoderOutput encoder_out = (*model_)->Encode(src);
  ASSERT_OK(processor->BeginBatch(src, encoder_out));
  ASSERT_OK(reference->BeginBatch(src, encoder_out));

  decode::StepContext step = RandomStep(6, local->info().dim, vocab);
  decode::StepContext expected = step;
  expected.log_probs = step.log_probs.clone();
  // BeginStep returns while the search it started is blocked: the search runs on its own thread.
  ASSERT_OK(processor->BeginStep(step));
  ASSERT_TRUE(gated.started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  gated.release.Notify();
  ASSERT_OK(processor->Process(step));
  // The same step without BeginStep, on the ungated retriever: the same interpolation.
  ASSERT_OK(reference->Process(expected));
  EXPECT_TRUE(torch::equal(step.log_probs, expected.log_probs));
  EXPECT_EQ(processor->stats().steps, 1);
  EXPECT_GT(processor->stats().search_time, absl::ZeroDuration());
}

TEST_F(KnnDecodeTest, WithoutOverlapTheSearchWaitsForProcess) {
  auto local = Local(*flat_);
  GatedRetriever gated(local.get());
  knn::KnnOptions options;
  options.k = 4;
  options.overlap_search = false;
  auto processor = MakeProcessor(&gated, options);
  const torch::Tensor src = SourceBatch(*pairs_);
  ASSERT_OK(processor->BeginBatch(src, (*model_)->Encode(src)));
  decode::StepContext step = RandomStep(2, local->info().dim, (*model_)->config().tgt_vocab_size);
  ASSERT_OK(processor->BeginStep(step));
  EXPECT_FALSE(gated.started.HasBeenNotified());
  gated.release.Notify();
  ASSERT_OK(processor->Process(step));
  EXPECT_TRUE(gated.started.HasBeenNotified());
  EXPECT_EQ(processor->stats().steps, 1);
}

TEST_F(KnnDecodeTest, AStepAbandonedAfterBeginStepLeavesTheProcessorUsable) {
  auto retriever = Local(*flat_);
  knn::KnnOptions options;
  options.k = 4;
  auto processor = MakeProcessor(retriever.get(), options);
  const torch::Tensor src = SourceBatch(*pairs_);
  const model::EncoderOutput encoder_out = (*model_)->Encode(src);
  const int64_t vocab = (*model_)->config().tgt_vocab_size;
  ASSERT_OK(processor->BeginBatch(src, encoder_out));
  decode::StepContext abandoned = RandomStep(3, retriever->info().dim, vocab);
  ASSERT_OK(processor->BeginStep(abandoned));
  // The search failed before Process (say, the model threw): the next batch starts cleanly,
  // and its step is answered with its own rows.
  ASSERT_OK(processor->BeginBatch(src, encoder_out));
  decode::StepContext step = RandomStep(5, retriever->info().dim, vocab);
  ASSERT_OK(processor->BeginStep(step));
  ASSERT_OK(processor->Process(step));
  EXPECT_EQ(processor->stats().steps, 1);
  EXPECT_EQ(processor->stats().query_rows, 5);
}

// --knn-threshold drops neighbours by squared L2 distance: against an inner-product index it is
// refused, not silently ignored.
TEST_F(KnnDecodeTest, ThresholdIsRefusedForAnInnerProductIndex) {
  class InnerProductInfo : public knn::Retriever {
   public:
    explicit InnerProductInfo(const knn::RetrieverInfo& info) : info_(info) {
      info_.metric = Metric::kInnerProduct;
    }
    const knn::RetrieverInfo& info() const override { return info_; }
    absl::StatusOr<std::unique_ptr<knn::RetrievalSession>> StartSession(SubsetGroups) override {
      return absl::UnimplementedError("not searched");
    }

   private:
    knn::RetrieverInfo info_;
  };
  InnerProductInfo retriever(Local(*flat_)->info());
  knn::KnnOptions options;
  options.threshold = 50;
  EXPECT_THAT(knn::KnnLogitsProcessor::Create(&retriever, options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("inner product")));
  options.threshold = 0;
  EXPECT_OK(knn::KnnLogitsProcessor::Create(&retriever, options, nullptr).status());
}

TEST_F(KnnDecodeTest, SubsetOnlyRetrieverServesSubsetKnnAndRefusesFullKnn) {
  ASSERT_OK_AND_ASSIGN(auto subset_only, knn::LocalRetriever::Create(pq_->index_dir, 1,
                                                                     /*full_search=*/false));
  EXPECT_TRUE(subset_only->info().subset_only);
  EXPECT_FALSE(Local(*pq_)->info().subset_only);
  knn::KnnOptions options;
  EXPECT_THAT(knn::KnnLogitsProcessor::Create(subset_only.get(), options, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("subset searches only")));
  // Subset kNN-MT on it translates as on the full engine.
  const torch::Tensor src = SourceBatch(*pairs_);
  ASSERT_OK_AND_ASSIGN(auto selector,
                       knn::SentenceIndexSelector::Load(pq_->sentence_index_dir, 3, 1));
  options.weight = 0.7;
  options.k = 4;
  options.temperature = 5;
  auto full_retriever = Local(*pq_);
  auto expected = MakeProcessor(full_retriever.get(), options, selector.get());
  auto got = MakeProcessor(subset_only.get(), options, selector.get());
  EXPECT_EQ(Decode(*model_, src, got.get(), 5), Decode(*model_, src, expected.get(), 5));
}

TEST_F(KnnDecodeTest, ProcessBeforeBeginBatchIsAnError) {
  auto retriever = Local(*flat_);
  auto processor = MakeProcessor(retriever.get(), knn::KnnOptions());
  decode::StepContext step =
      RandomStep(2, retriever->info().dim, (*model_)->config().tgt_vocab_size);
  EXPECT_THAT(processor->BeginStep(step),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("BeginBatch")));
  EXPECT_THAT(processor->Process(step),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("BeginBatch")));
}

TEST_F(KnnDecodeTest, RemoteStepDeadlineAndUnreachableRouterAreClearErrors) {
  knn::RemoteRetrieverOptions options;
  options.address = "127.0.0.1:1";
  options.connect_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<knn::RemoteRetriever>> r = knn::RemoteRetriever::Create(options);
  EXPECT_THAT(r.status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::HasSubstr("127.0.0.1:1")));
}

}  // namespace
}  // namespace knnserve::testing
