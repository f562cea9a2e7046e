#include "client/decode/search.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/test_models.h"

namespace knnserve::decode {
namespace {

using ::knnserve::testing::RandomSources;
using ::knnserve::testing::StatusIs;
using ::knnserve::testing::TinyModel;
using ::testing::HasSubstr;

// Teacher-forced log-probability of tokens + EOS under `model` for source row `src`.
std::vector<float> ForcedLogProbs(model::TransformerModel& model, const torch::Tensor& src,
                                  const std::vector<int>& tokens) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> prev = {2};
  std::vector<int64_t> target;
  for (int t : tokens) {
    prev.push_back(t);
    target.push_back(t);
  }
  target.push_back(2);
  torch::Tensor logits =
      model->Decode(torch::tensor(prev).unsqueeze(0), model->Encode(src.unsqueeze(0))).logits[0];
  torch::Tensor lp = torch::log_softmax(logits, -1);
  std::vector<float> out;
  for (size_t i = 0; i < target.size(); ++i) out.push_back(lp[i][target[i]].item<float>());
  return out;
}

TEST(SearchTest, BeamOfOneEqualsGreedy) {
  model::TransformerModel model = TinyModel();
  torch::Tensor src = RandomSources({6, 3, 8, 5}, 40);
  SearchOptions options;
  options.beam_size = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<Hypothesis> greedy, GreedySearch(model, src, options));
  ASSERT_OK_AND_ASSIGN(auto beam, BeamSearch(model, src, options));
  ASSERT_EQ(beam.size(), greedy.size());
  for (size_t i = 0; i < greedy.size(); ++i) {
    ASSERT_EQ(beam[i].size(), 1u);
    EXPECT_EQ(beam[i][0].tokens, greedy[i].tokens) << "sentence " << i;
    EXPECT_NEAR(beam[i][0].score, greedy[i].score, 1e-5);
  }
}

TEST(SearchTest, NbestIsSortedAndScoresAreTheModelsLogProbabilities) {
  model::TransformerModel model = TinyModel();
  torch::Tensor src = RandomSources({6, 4, 7}, 40);
  SearchOptions options;
  options.beam_size = 4;
  options.nbest = 4;
  options.length_penalty = 1.0;
  ASSERT_OK_AND_ASSIGN(auto nbest, BeamSearch(model, src, options));
  for (int64_t i = 0; i < src.size(0); ++i) {
    ASSERT_EQ(nbest[i].size(), 4u);
    for (size_t h = 0; h < nbest[i].size(); ++h) {
      const Hypothesis& hyp = nbest[i][h];
      if (h > 0) EXPECT_GE(nbest[i][h - 1].score, hyp.score);
      // Rescoring the hypothesis teacher-forced reproduces the search's per-token numbers:
      // the cached, reordered beam states computed the right thing.
      std::vector<float> forced = ForcedLogProbs(model, src[i], hyp.tokens);
      ASSERT_EQ(forced.size(), hyp.token_log_probs.size());
      double sum = 0;
      for (size_t t = 0; t < forced.size(); ++t) {
        EXPECT_NEAR(forced[t], hyp.token_log_probs[t], 1e-4);
        sum += hyp.token_log_probs[t];
      }
      EXPECT_NEAR(hyp.score, sum / static_cast<double>(hyp.tokens.size() + 1), 1e-4);
    }
  }
}

TEST(SearchTest, BatchedBeamSearchEqualsOneSentenceAtATime) {
  model::TransformerModel model = TinyModel();
  torch::Tensor src = RandomSources({7, 3, 5}, 40);
  SearchOptions options;
  options.beam_size = 3;
  ASSERT_OK_AND_ASSIGN(auto batched, BeamSearch(model, src, options));
  for (int64_t i = 0; i < src.size(0); ++i) {
    const int64_t len = src[i].ne(1).sum().item<int64_t>();
    ASSERT_OK_AND_ASSIGN(auto single,
                         BeamSearch(model, src[i].narrow(0, 0, len).unsqueeze(0), options));
    EXPECT_EQ(single[0][0].tokens, batched[i][0].tokens) << "sentence " << i;
  }
}

TEST(SearchTest, MaxLengthIsRespected) {
  model::TransformerModel model = TinyModel();
  torch::Tensor src = RandomSources({9, 9}, 40);
  SearchOptions options;
  options.max_len_a = 0;
  options.max_len_b = 2;
  options.min_len = 2;  // the untrained model must run into the limit
  for (int beam : {1, 3}) {
    options.beam_size = beam;
    ASSERT_OK_AND_ASSIGN(std::vector<Hypothesis> greedy, GreedySearch(model, src, options));
    ASSERT_OK_AND_ASSIGN(auto nbest, BeamSearch(model, src, options));
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(nbest[i][0].tokens.size(), 2u);
      if (beam == 1) EXPECT_EQ(greedy[i].tokens.size(), 2u);
    }
  }
}

// Forces a fixed output through the hook and records what it was shown.
class ForcingProcessor : public LogitsProcessor {
 public:
  explicit ForcingProcessor(std::vector<int64_t> forced) : forced_(std::move(forced)) {}
  absl::Status Process(StepContext& context) override {
    rows_seen.push_back(context.log_probs.size(0));
    EXPECT_EQ(context.features.sizes(), (std::vector<int64_t>{context.log_probs.size(0), 32}));
    EXPECT_EQ(context.ffn_in.sizes(), context.features.sizes());
    EXPECT_EQ(context.sentence.size(0), context.log_probs.size(0));
    sentences_seen = context.sentence.max().item<int64_t>() + 1;
    const int64_t token = context.step < static_cast<int64_t>(forced_.size())
                              ? forced_[context.step]
                              : 2;  // EOS afterwards
    torch::Tensor forced = torch::full_like(context.log_probs, -1e9);
    forced.select(1, token).fill_(0.0);
    context.log_probs = forced;
    return absl::OkStatus();
  }
  std::vector<int64_t> rows_seen;
  int64_t sentences_seen = 0;

 private:
  std::vector<int64_t> forced_;
};

TEST(SearchTest, LogitsProcessorSeesStepFeaturesAndRewritesScores) {
  model::TransformerModel model = TinyModel();
  torch::Tensor src = RandomSources({5, 4}, 40);
  for (int beam : {1, 3}) {
    ForcingProcessor processor({7, 9, 7});
    SearchOptions options;
    options.beam_size = beam;
    options.processor = &processor;
    ASSERT_OK_AND_ASSIGN(auto nbest, BeamSearch(model, src, options));
    for (const auto& hyps : nbest) EXPECT_EQ(hyps[0].tokens, (std::vector<int>{7, 9, 7}));
    EXPECT_EQ(processor.rows_seen.front(), 2 * beam);
    EXPECT_EQ(processor.sentences_seen, 2);
  }
}

// Records each step's live rows and, unless told not to, writes a large score for one token
// into every dead row: a search must not read them.
class DeadRowScribbler : public LogitsProcessor {
 public:
  explicit DeadRowScribbler(bool scribble) : scribble_(scribble) {}
  absl::Status Process(StepContext& context) override {
    live_rows_seen.push_back(context.live_rows);
    if (!scribble_) return absl::OkStatus();
    std::vector<bool> live(context.log_probs.size(0));
    for (const int64_t r : context.live_rows) live[r] = true;
    for (int64_t r = 0; r < context.log_probs.size(0); ++r) {
      if (!live[r]) context.log_probs[r].fill_(-50.0f).index_fill_(0, torch::tensor({7}), 100.0f);
    }
    return absl::OkStatus();
  }
  std::vector<std::vector<int64_t>> live_rows_seen;

 private:
  const bool scribble_;
};

TEST(SearchTest, DeadRowsAreTheFirstStepsSpareBeamsAndNothingReadsThem) {
  model::TransformerModel model = TinyModel();
  const torch::Tensor src = RandomSources({6, 3, 8}, 40);
  SearchOptions options;
  options.beam_size = 4;
  options.nbest = 4;
  DeadRowScribbler plain(false), scribbling(true);
  options.processor = &plain;
  ASSERT_OK_AND_ASSIGN(auto expected, BeamSearch(model, src, options));
  options.processor = &scribbling;
  ASSERT_OK_AND_ASSIGN(auto got, BeamSearch(model, src, options));
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), expected[i].size());
    for (size_t h = 0; h < got[i].size(); ++h) {
      EXPECT_EQ(got[i][h].tokens, expected[i][h].tokens);
      EXPECT_EQ(got[i][h].score, expected[i][h].score);
    }
  }
  ASSERT_GE(plain.live_rows_seen.size(), 2u);
  EXPECT_EQ(plain.live_rows_seen[0], (std::vector<int64_t>{0, 4, 8}));  // one row per sentence
  EXPECT_EQ(plain.live_rows_seen[1].size(), 12u);                       // then every beam
  // Greedy search has no dead rows.
  options.beam_size = 1;
  options.nbest = 1;
  DeadRowScribbler greedy(false);
  options.processor = &greedy;
  ASSERT_OK(GreedySearch(model, src, options).status());
  EXPECT_EQ(greedy.live_rows_seen[0], (std::vector<int64_t>{0, 1, 2}));
}

TEST(SearchTest, ProcessorErrorsStopTheSearch) {
  class Failing : public LogitsProcessor {
    absl::Status Process(StepContext&) override { return absl::UnavailableError("router down"); }
  } failing;
  model::TransformerModel model = TinyModel();
  SearchOptions options;
  options.processor = &failing;
  EXPECT_THAT(BeamSearch(model, RandomSources({4}, 40), options),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("router down")));
}

// Logs its calls ("A begin-batch", "A begin-step 0", "A process 0", ...) into a shared log
// and, like kNN-MT, rewrites the scores from the features: the token whose logit the features'
// sum picks gets a bonus, so the output depends on every step's features reaching Process.
class LoggingProcessor : public LogitsProcessor {
 public:
  LoggingProcessor(std::string name, std::vector<std::string>* log)
      : name_(std::move(name)), log_(log) {}
  absl::Status BeginBatch(const torch::Tensor&, const model::EncoderOutput&) override {
    log_->push_back(name_ + " begin-batch");
    return absl::OkStatus();
  }
  absl::Status BeginStep(const StepContext& context) override {
    log_->push_back(absl::StrCat(name_, " begin-step ", context.step));
    return absl::OkStatus();
  }
  absl::Status Process(StepContext& context) override {
    log_->push_back(absl::StrCat(name_, " process ", context.step));
    const torch::Tensor pick =
        (context.features.sum(1) * 1000).abs().to(torch::kLong) % context.log_probs.size(1);
    context.log_probs = context.log_probs.scatter_add(
        1, pick.unsqueeze(1), torch::full({context.log_probs.size(0), 1}, 3.0f));
    return absl::OkStatus();
  }

 private:
  const std::string name_;
  std::vector<std::string>* const log_;
};

TEST(SearchTest, InterleavedBatchesFindWhatEachBatchFindsAlone) {
  model::TransformerModel model = TinyModel();
  const std::vector<torch::Tensor> batches = {RandomSources({6, 3, 8}, 40, 1),
                                              RandomSources({5, 7}, 40, 2),
                                              RandomSources({4, 9, 2, 6}, 40, 3)};
  std::vector<std::string> log;
  LoggingProcessor alone("alone", &log), first("A", &log), second("B", &log);
  SearchOptions options;
  options.beam_size = 3;
  options.nbest = 2;
  options.processor = &alone;
  std::vector<std::vector<std::vector<Hypothesis>>> expected;
  for (const torch::Tensor& batch : batches) {
    ASSERT_OK_AND_ASSIGN(auto nbest, BeamSearch(model, batch, options));
    expected.push_back(std::move(nbest));
  }
  options.processor = &first;
  options.second_processor = &second;
  log.clear();
  ASSERT_OK_AND_ASSIGN(auto interleaved, BeamSearchBatches(model, batches, options));
  ASSERT_EQ(interleaved.size(), batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    ASSERT_EQ(interleaved[b].size(), expected[b].size());
    for (size_t s = 0; s < expected[b].size(); ++s) {
      ASSERT_EQ(interleaved[b][s].size(), expected[b][s].size());
      for (size_t h = 0; h < expected[b][s].size(); ++h) {
        EXPECT_EQ(interleaved[b][s][h].tokens, expected[b][s][h].tokens);
        EXPECT_EQ(interleaved[b][s][h].score, expected[b][s][h].score);
      }
    }
  }
  // The second batch's step runs between the first batch's BeginStep and Process: that is
  // where a processor's retrieval overlaps the model.
  ASSERT_GE(log.size(), 8u);
  EXPECT_EQ(std::vector<std::string>(log.begin(), log.begin() + 8),
            (std::vector<std::string>{"A begin-batch", "A begin-step 0", "B begin-batch",
                                      "B begin-step 0", "A process 0", "A begin-step 1",
                                      "B process 0", "B begin-step 1"}));
  // The third batch went to whichever processor finished first.
  EXPECT_EQ(std::count(log.begin(), log.end(), "A begin-batch") +
                std::count(log.begin(), log.end(), "B begin-batch"),
            3);
}

TEST(SearchTest, InvalidOptionsAreRejected) {
  model::TransformerModel model = TinyModel();
  SearchOptions options;
  options.beam_size = 2;
  options.nbest = 3;
  EXPECT_THAT(BeamSearch(model, RandomSources({4}, 40), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nbest")));
  options.beam_size = 0;
  EXPECT_THAT(GreedySearch(model, RandomSources({4}, 40), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("beam size")));
  std::vector<std::string> log;
  LoggingProcessor processor("A", &log);
  options = SearchOptions();
  options.second_processor = &processor;
  EXPECT_THAT(BeamSearch(model, RandomSources({4}, 40), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("second logits processor")));
  options.processor = &processor;
  EXPECT_THAT(BeamSearchBatches(model, {RandomSources({4}, 40)}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one per batch")));
  EXPECT_TRUE(log.empty());
}

}  // namespace
}  // namespace knnserve::decode
