// Test vectors from sacreBLEU's own test suite (github.com/mjpost/sacrebleu, test/test_bleu.py
// and test/test_chrf.py): the numbers are sacreBLEU's outputs.
#include "client/eval/bleu.h"

#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnserve::eval {
namespace {

using ::testing::HasSubstr;
using ::testing::DoubleNear;

const std::vector<std::vector<std::string>> kReadmeRefs = {
    {"The dog bit the man.", "It was not unexpected.", "The man bit him first."},
    {"The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."},
};
const std::vector<std::string> kReadmeHyps = {
    "The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."};

double Bleu(const std::vector<std::string>& hyps,
            const std::vector<std::vector<std::string>>& refs, const BleuOptions& options = {}) {
  absl::StatusOr<BleuScore> score = CorpusBleu(hyps, refs, options);
  EXPECT_OK(score.status());
  return score.ok() ? score->score : -1;
}

// sacreBLEU's raw_corpus_bleu: no tokenization, floor smoothing, effective order.
BleuOptions Raw(double floor) {
  BleuOptions options;
  options.tokenize = "none";
  options.smooth_method = "floor";
  options.smooth_value = floor;
  options.effective_order = true;
  return options;
}

TEST(BleuTest, CorpusBleuMatchesSacrebleuDefaults) {
  EXPECT_THAT(Bleu(kReadmeHyps, kReadmeRefs), DoubleNear(48.530827, 1e-6));
}

TEST(BleuTest, EmptyHypothesesScoreZero) {
  EXPECT_EQ(Bleu({"", "", ""}, kReadmeRefs), 0.0);
}

TEST(BleuTest, TokenizeNoneAndSmoothNoneMatchSacrebleu) {
  BleuOptions none;
  none.tokenize = "none";
  EXPECT_THAT(Bleu(kReadmeHyps, kReadmeRefs, none), DoubleNear(49.1919566, 1e-6));
  BleuOptions no_smooth;
  no_smooth.smooth_method = "none";
  EXPECT_THAT(Bleu(kReadmeHyps, kReadmeRefs, no_smooth), DoubleNear(48.530827, 1e-6));
}

TEST(BleuTest, MaxNgramOrderMatchesSacrebleu) {
  const std::vector<std::string> expected = {"77.65", "60.50", "53.93",
                                             "48.53", "46.14", "43.28"};
  for (int order = 1; order <= 6; ++order) {
    BleuOptions options;
    options.max_ngram_order = order;
    char formatted[32];
    std::snprintf(formatted, sizeof(formatted), "%.2f", Bleu(kReadmeHyps, kReadmeRefs, options));
    EXPECT_EQ(formatted, expected[order - 1]) << "order " << order;
  }
}

TEST(BleuTest, RawCorpusBleuMatchesSacrebleu) {
  EXPECT_EQ(Bleu({"this is a test", "another test"}, {{"ref1", "ref2"}}, Raw(0.01)), 0.0);
  EXPECT_THAT(Bleu({"this is a test"}, {{"this is a test"}}, Raw(0.01)) / 100,
              DoubleNear(1.0, 1e-8));
  EXPECT_THAT(Bleu({"this is a fest"}, {{"this is a test"}}, Raw(0.01)) / 100,
              DoubleNear(0.223606797749979, 1e-8));
}

TEST(BleuTest, EffectiveOrderMatchesSacrebleu) {
  EXPECT_THAT(Bleu({"test"}, {{"a test"}}, Raw(0.01)) / 100,
              DoubleNear(0.3678794411714425, 1e-8));
  EXPECT_THAT(Bleu({"a test"}, {{"a test"}}, Raw(0.01)) / 100, DoubleNear(1.0, 1e-8));
  EXPECT_THAT(Bleu({"a little test"}, {{"a test"}}, Raw(0.01)) / 100,
              DoubleNear(0.03218297948685433, 1e-8));
}

TEST(BleuTest, StatisticsAndFloorOffsetMatchSacrebleu) {
  const std::vector<std::string> hyp = {"am I am a character sequence"};
  const std::vector<std::vector<std::string>> ref = {{"I am a symbol string sequence a a"}};
  ASSERT_OK_AND_ASSIGN(BleuScore score, CorpusBleu(hyp, ref, Raw(0.01)));
  EXPECT_THAT(score.stats.correct, ::testing::ElementsAre(4, 2, 1, 0));
  EXPECT_THAT(score.stats.total, ::testing::ElementsAre(6, 5, 4, 3));
  EXPECT_EQ(Bleu(hyp, ref, Raw(0.0)), 0.0);
  EXPECT_THAT(Bleu(hyp, ref, Raw(0.1)) / 100, DoubleNear(0.1555722182, 1e-8));
}

TEST(BleuTest, ScoreFromStatisticsMatchesSacrebleu) {
  BleuStats stats{11, 11, {9, 7, 5, 3}, {10, 8, 6, 4}};
  BleuOptions options;
  options.smooth_method = "none";
  EXPECT_THAT(ComputeBleu(stats, options).score / 100, DoubleNear(0.8375922397, 1e-8));
}

TEST(BleuTest, FormatAndSignatureLookLikeSacrebleu) {
  ASSERT_OK_AND_ASSIGN(BleuScore score, CorpusBleu(kReadmeHyps, kReadmeRefs));
  EXPECT_THAT(score.Format(), HasSubstr("BLEU = 48.53 "));
  EXPECT_THAT(BleuSignature({}, 2), HasSubstr("nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|"));
  EXPECT_THAT(ChrfSignature({}, 1), HasSubstr("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|"));
}

TEST(BleuTest, MismatchedStreamsAreRejected) {
  EXPECT_THAT(CorpusBleu({"a", "b"}, {{"a"}}),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 lines")));
  EXPECT_THAT(CorpusChrf({"a"}, {}), testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                       HasSubstr("no reference")));
}

TEST(Tokenize13aTest, SplitsPunctuationLikeMteval) {
  EXPECT_EQ(Tokenize13a("Hello, world!"), "Hello , world !");
  EXPECT_EQ(Tokenize13a("It costs 3.14 or 1,000."), "It costs 3.14 or 1,000 .");
  EXPECT_EQ(Tokenize13a("pages 1-2"), "pages 1 - 2");
  EXPECT_EQ(Tokenize13a("&quot;Größe&quot; &amp; <skipped>mehr"), "\" Größe \" & mehr");
  EXPECT_EQ(Tokenize13a("  a\tb  "), "a b");
}

double Chrf(const std::vector<std::string>& hyps, const std::vector<std::string>& refs,
            double beta, bool eps) {
  ChrfOptions options;
  options.beta = beta;
  options.eps_smoothing = eps;
  absl::StatusOr<double> score = CorpusChrf(hyps, {refs}, options);
  EXPECT_OK(score.status());
  return score.ok() ? *score : -1;
}

TEST(ChrfTest, EpsilonSmoothingMatchesSacrebleu) {
  struct Case {
    std::vector<std::string> hyp, ref;
    double expected;
  };
  const std::vector<Case> cases = {
      {{"abcdefg"}, {"hijklmnop"}, 0.0},
      {{"a"}, {"b"}, 0.0},
      {{""}, {"b"}, 0.0},
      {{""}, {"ref"}, 0.0},
      {{""}, {"reference"}, 0.0},
      {{"aa"}, {"ab"}, 8.3333},
      {{"a", "b"}, {"a", "c"}, 8.3333},
      {{"a"}, {"a"}, 16.6667},
      {{"a b c"}, {"a b c"}, 50.0},
      {{"a b c"}, {"abc"}, 50.0},
      {{" risk assessment must be made of those who are qualified and expertise in the sector "
        "- these are the scientists ."},
       {"risk assessment has to be undertaken by those who are qualified and expert in that "
        "area - that is the scientists ."},
       63.361730},
      {{" Die    Beziehung zwischen  Obama und Netanjahu ist nicht gerade  freundlich. "},
       {"Das Verhältnis zwischen Obama und Netanyahu ist nicht gerade freundschaftlich."},
       64.1302698},
      {{"Niemand hat die Absicht, eine Mauer zu errichten"},
       {"Niemand hat die Absicht, eine Mauer zu errichten"},
       100.0},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Chrf(c.hyp, c.ref, 3, true), DoubleNear(c.expected, 1e-4)) << c.hyp[0];
  }
}

TEST(ChrfTest, EffectiveOrderMatchesSacrebleu) {
  EXPECT_THAT(Chrf({"a"}, {"a"}, 3, false), DoubleNear(100.0, 1e-4));
  EXPECT_THAT(Chrf({""}, {"reference"}, 3, false), DoubleNear(0.0, 1e-4));
  EXPECT_THAT(Chrf({"a b c"}, {"a b c"}, 3, false), DoubleNear(100.0, 1e-4));
  EXPECT_THAT(Chrf({"a b c"}, {"abc"}, 3, false), DoubleNear(100.0, 1e-4));
  EXPECT_THAT(Chrf({""}, {"c"}, 3, false), DoubleNear(0.0, 1e-4));
  EXPECT_THAT(Chrf({"a", "b"}, {"a", "c"}, 3, false), DoubleNear(50.0, 1e-4));
  EXPECT_THAT(Chrf({"aa"}, {"ab"}, 3, false), DoubleNear(25.0, 1e-4));
}

TEST(ChrfTest, SentenceLevelChrf2MatchesSacrebleu) {
  EXPECT_THAT(Chrf({"Co nás nejvíc trápí, protože lékaři si vybírají, kdo bude žít a kdo zemře."},
                   {"Nejvíce smutní jsme z toho, že musíme rozhodovat o tom, kdo bude žít a kdo "
                    "zemře."},
                   2, true),
              DoubleNear(39.14078509, 1e-4));
  EXPECT_THAT(Chrf({"Nebo prostě nemají vybavení, které by jim pomohlo, uvedli lékaři."},
                   {"A někdy nemáme ani potřebný materiál, abychom jim pomohli, popsali lékaři."},
                   2, true),
              DoubleNear(31.22557079, 1e-4));
  EXPECT_THAT(Chrf({"Lapali po dechu, jejich životy skončily dřív, než skutečně začaly."},
                   {"Lapali po dechu a pak jejich život skončil - dřív, než skutečně mohl začít, "
                    "připomněli."},
                   2, true),
              DoubleNear(57.15704367, 1e-4));
}

}  // namespace
}  // namespace knnserve::eval
