#include "client/train/trainer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "client/data/parallel_corpus.h"
#include "client/decode/search.h"
#include "client/eval/bleu.h"
#include "client/model/checkpoint.h"
#include "client/tokenizer/tokenizer.h"
#include "client/train/batching.h"
#include "client/train/optimizer.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace knnserve::train {
namespace {

using ::testing::HasSubstr;

const char kPairs[] = KNNSERVE_TESTDATA_DIR "/pairs50.tsv";

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTempDir("trainer_test");
    TokenizerTrainOptions tok;
    tok.tsv_path = kPairs;
    tok.model_prefix = (dir_ / "spm").string();
    tok.vocab_size = 120;
    tok.hard_vocab_limit = false;
    tok.threads = 1;
    ASSERT_OK(TrainTokenizer(tok));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The tiny recipe: trains in well under two minutes on one core.
  TrainOptions TinyRecipe() const {
    TrainOptions o;
    o.train_tsv = kPairs;
    o.tokenizer_path = (dir_ / "spm.model").string();
    o.out_dir = (dir_ / "run").string();
    o.model.d_model = 64;
    o.model.encoder_layers = o.model.decoder_layers = 2;
    o.model.encoder_heads = o.model.decoder_heads = 4;
    o.model.encoder_ffn_dim = o.model.decoder_ffn_dim = 128;
    o.model.encoder_normalize_before = o.model.decoder_normalize_before = true;
    o.model.max_source_positions = o.model.max_target_positions = 64;
    o.model.dropout = 0.0;
    o.label_smoothing = 0.0;
    o.adam.lr = 3e-3;
    o.adam.warmup_steps = 30;
    o.max_tokens = 256;
    o.max_steps = 500;
    o.valid_bleu_sentences = 0;
    o.save_every_minutes = 60;
    o.log_every_steps = 100;
    o.threads = 1;
    return o;
  }

  std::filesystem::path dir_;
};

TEST_F(TrainerTest, TinyModelOverfitsFiftyPairs) {
  TrainOptions options = TinyRecipe();
  ASSERT_OK(Train(options));
  ASSERT_OK_AND_ASSIGN(model::LoadedModel loaded,
                       model::LoadCheckpoint(options.out_dir + "/checkpoint_last.pt"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer,
                       Tokenizer::FromSerialized(loaded.tokenizer));
  ASSERT_OK_AND_ASSIGN(std::vector<data::SentencePair> pairs, data::ReadTsv(kPairs));
  std::vector<std::string> sources, references;
  for (const auto& p : pairs) {
    sources.push_back(p.source);
    references.push_back(p.target);
  }
  decode::SearchOptions search;
  search.beam_size = 1;
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> hyps,
                       decode::TranslateTexts(loaded.model, *tokenizer, sources, search, 16));
  ASSERT_OK_AND_ASSIGN(eval::BleuScore bleu, eval::CorpusBleu(hyps, {references}));
  EXPECT_GE(bleu.score, 90.0) << bleu.Format();
  // Empty and blank lines translate to empty lines; the others as they do alone.
  decode::TranslateStats stats;
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> with_blanks,
                       decode::TranslateTexts(loaded.model, *tokenizer, {"", sources[0], " \t"},
                                              search, 16, &stats));
  EXPECT_EQ(with_blanks, (std::vector<std::string>{"", hyps[0], ""}));
  EXPECT_EQ(stats.sentences, 3);
}

TEST_F(TrainerTest, ResumesFromItsLastCheckpoint) {
  TrainOptions options = TinyRecipe();
  options.max_steps = 3;
  options.valid_tsv = kPairs;
  options.valid_bleu_sentences = 4;
  ASSERT_OK(Train(options));
  options.max_steps = 5;
  ASSERT_OK(Train(options));
  ASSERT_OK_AND_ASSIGN(model::LoadedModel loaded,
                       model::LoadCheckpoint(options.out_dir + "/checkpoint_last.pt"));
  ASSERT_TRUE(loaded.trainer.has_value());
  EXPECT_THAT(loaded.trainer->json, HasSubstr("\"step\":5"));
  EXPECT_TRUE(loaded.trainer->tensors.count("exp_avg.encoder.embed_tokens.weight"));
  std::ifstream log(options.out_dir + "/train.log");
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("resuming from"));
  EXPECT_THAT(text.str(), HasSubstr("greedy BLEU (4 sents)"));
}

TEST(BatchingTest, BatchesRespectTheTokenBudgetAndCoverEveryExample) {
  std::vector<Example> examples;
  for (int i = 1; i <= 40; ++i) {
    examples.push_back({std::vector<int>(i % 13 + 1, 5), std::vector<int>(i % 7 + 1, 6)});
  }
  const auto batches = MakeBatches(examples, 30, /*seed=*/3);
  std::vector<int> seen(examples.size(), 0);
  for (const auto& batch : batches) {
    size_t longest = 0;
    for (int64_t i : batch) {
      ++seen[i];
      longest = std::max({longest, examples[i].source.size(), examples[i].target.size()});
    }
    EXPECT_LE(longest * batch.size(), 30u);
  }
  for (int count : seen) EXPECT_EQ(count, 1);
  TensorBatch t = Collate(examples, {0, 1}, /*pad_id=*/1, /*eos_id=*/2);
  EXPECT_EQ(t.prev_tokens[0][0].item<int64_t>(), 2);
  EXPECT_TRUE(t.prev_tokens[0]
                  .narrow(0, 1, examples[0].target.size() - 1)
                  .equal(t.target[0].narrow(0, 0, examples[0].target.size() - 1)));
}

TEST(OptimizerTest, InverseSqrtScheduleWarmsUpThenDecays) {
  AdamOptions o;
  o.lr = 1e-3;
  o.warmup_steps = 100;
  o.warmup_init_lr = 0;
  EXPECT_NEAR(InverseSqrtLr(o, 50), 5e-4, 1e-12);
  EXPECT_NEAR(InverseSqrtLr(o, 100), 1e-3, 1e-12);
  EXPECT_NEAR(InverseSqrtLr(o, 400), 5e-4, 1e-12);
}

TEST(OptimizerTest, LabelSmoothedLossMatchesFairseqFormula) {
  torch::Tensor logits = torch::tensor({{{2.0f, 0.5f, -1.0f, 0.0f}, {0.1f, 0.2f, 0.3f, 0.4f}}});
  torch::Tensor target = torch::tensor({{2, 1}}, torch::kLong);  // second position is padding
  LossSums sums = LabelSmoothedLoss(logits, target, /*pad_id=*/1, /*epsilon=*/0.1);
  torch::Tensor lp = torch::log_softmax(logits[0][0], 0);
  const double nll = -lp[2].item<double>();
  const double smooth = -lp.sum().item<double>();
  const double eps_i = 0.1 / 3;
  EXPECT_NEAR(sums.nll.item<double>(), nll, 1e-5);
  EXPECT_NEAR(sums.loss.item<double>(), (1 - 0.1 - eps_i) * nll + eps_i * smooth, 1e-5);
}

}  // namespace
}  // namespace knnserve::train
